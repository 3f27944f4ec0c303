// Keeps an HTTP listener answerable while clients hold connections without finishing requests
// (slowloris: one header line or body byte every few seconds keeps an idle timer from firing, and
// enough such connections fill every slot, so health probes and scrapes are refused):
// - a deadline for reading each request: a connection must deliver a whole request (line,
//   headers and body; on HTTPS the TLS handshake before the first) within `read_timeout` of
//   opening or of the first byte of its request line, or its socket is shut down;
// - at capacity, a new connection is admitted by shutting down an idle keep-alive connection
//   (longest idle first) or else the one that has been reading its request longest (never one
//   whose request is being answered), so a probe always gets in while attackers hold the slots;
// - an optional cap on connections per client address.
// A keep-alive connection between requests has no deadline here: the listener's idle timeout
// closes it, and that is not a refusal.
// It knows sockets and opaque connection keys, not the HTTP stack: each connection feeds it events.
// Thread-safe. Shutting a socket down (not closing it) makes its owner see the end of the stream
// and close it through its usual path, so the descriptor is never closed under its owner.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/periodic_thread.h"

namespace specula {

struct HttpConnectionGuardOptions {
  absl::Duration read_timeout = absl::Seconds(10);
  int max_connections = 1024;
  int max_per_peer = 0;  // connections from one client address at once; 0 = no limit
  // Called (under no lock) for each connection refused or shut down: "per_ip_limit",
  // "connection_limit", "read_timeout", "evicted".
  std::function<void(absl::string_view reason)> on_refused;
};

class HttpConnectionGuard {
 public:
  explicit HttpConnectionGuard(HttpConnectionGuardOptions options,
                               std::function<absl::Time()> now = &absl::Now);
  HttpConnectionGuard(const HttpConnectionGuard&) = delete;
  HttpConnectionGuard& operator=(const HttpConnectionGuard&) = delete;

  // Starts the thread that runs Sweep a few times per read_timeout.
  void StartSweeper();

  // Whether a new connection from `peer` may be accepted. At capacity it makes room by shutting
  // down an idle or the longest-reading connection; with none to shut, it refuses.
  bool Admit(absl::string_view peer);
  // A connection was accepted: it now reads its first request (the deadline runs).
  void Opened(const void* key, int fd, std::string peer);
  // The first line of a request arrived on a kept-alive connection: the deadline runs again.
  void RequestStarted(const void* key);
  // The whole request (head and body) is read: no deadline while it is answered.
  void RequestRead(const void* key);
  // Its response is done: idle until its next request line.
  void ResponseDone(const void* key);
  // It is closed (before its descriptor is): forgotten.
  void Closed(const void* key);

  // Shuts down the connections past their read deadline; returns how many.
  int Sweep();

  // Connections open and not shut down.
  int open() const;

 private:
  enum class State { kReading, kAnswering, kIdle };
  struct Entry {
    int fd = -1;
    std::string peer;
    State state = State::kReading;
    absl::Time since;  // when it entered its state
    bool shut = false;
  };
  // Shuts `e`'s socket down once; the caller holds mu_.
  void ShutLocked(Entry& e);
  // The connection to shut down to make room: the longest idle, else the longest reading; null
  // when every one is being answered. The caller holds mu_.
  Entry* EvictionCandidateLocked();
  void SetState(const void* key, State state);
  int OpenLocked() const { return static_cast<int>(entries_.size()) - shut_; }
  void Report(absl::string_view reason, int times) const;

  const HttpConnectionGuardOptions options_;
  const std::function<absl::Time()> now_;
  mutable std::mutex mu_;
  absl::flat_hash_map<const void*, Entry> entries_;  // guarded by mu_
  absl::flat_hash_map<std::string, int> per_peer_;   // guarded by mu_
  int shut_ = 0;                                     // entries shut, not yet closed; mu_
  std::optional<PeriodicThread> sweeper_;            // last: stopped before the rest goes
};

}  // namespace specula
