// Internal to the HTTP listener (http_server.cc, http_connection.cc): what an asynchronous
// exchange shares between the HttpExchange handed to its route (any thread) and the connection
// that writes the answer (on its strand), and what exchanges share with their server, which they
// may outlive.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "server/http_server.h"

namespace specula {

class ConnectionWatcher;

// Whether the server's event loop still exists: a wake-up posted after it is gone would touch
// freed memory, so every wake-up holds `mu` shared and the server's stop takes it exclusively.
struct ServerGate {
  std::shared_mutex mu;
  bool stopped = false;  // guarded by mu
};

struct HttpExchangeState {
  std::mutex mu;
  std::shared_ptr<ServerGate> gate;
  // Set before the route sees the exchange: posts a wake-up to the connection waiting for the
  // answer (or its next piece). It holds the connection's timer, so FinishExchange, which always
  // runs before the event loop is destroyed, clears it: an exchange may outlive its server.
  // Guarded by mu; called (a copy) under the gate without mu.
  std::function<void()> wake;
  enum class Mode { kWaiting, kFull, kStream } mode = Mode::kWaiting;  // guarded by mu
  HttpResponse response;          // kFull: all of it; kStream: status and headers; guarded by mu
  std::string pending;            // streamed bytes not written yet; guarded by mu
  bool ended = false;             // End() ran: the stream ends once `pending` is written; mu
  bool gone = false;              // the client left before the answer was complete; mu
  bool finished = false;          // the connection is done with it: later answers go nowhere; mu
  std::function<void()> on_gone;  // guarded by mu
  // The hang-up watch on the connection's socket while the connection waits for the answer or
  // its next piece (never while it writes: a client that reads the last byte and closes must not
  // be taken for one that left; a write to a client that left fails by itself).
  ConnectionWatcher* watcher = nullptr;
  uint64_t watch_id = 0;  // guarded by mu; 0 = not watching
};

// Wakes the connection of `state` unless its server stopped. Without state.mu held.
void WakeConnection(HttpExchangeState& state);

// Starts and stops watching `fd`, the connection's socket, for a hang-up.
void WatchForHangUp(const std::shared_ptr<HttpExchangeState>& state, int fd);
void StopWatchingForHangUp(HttpExchangeState& state);

// The client hung up (reported by the watcher) before the answer was complete: the route hears
// it, and the connection wakes to close.
void ClientHungUp(const std::weak_ptr<HttpExchangeState>& weak);

// The connection is done with the exchange: later answers go nowhere, the watch ends, and unless
// the answer went out whole (`completed`), the route hears that the client is gone.
void FinishExchange(HttpExchangeState& state, bool completed);

}  // namespace specula
