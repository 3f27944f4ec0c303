// The plaintext gRPC listener, owned by specula instead of gRPC (issue 32): gRPC 1.51 stops
// accepting for good after one failed accept4 (EMFILE; grpc/grpc#20418), and it has no cap on
// incoming connections. This acceptor binds the socket, accepts on its own thread, and hands each
// connection to the gRPC server (grpc::AddInsecureChannelFromFd), so:
// - a failed accept (out of descriptors) is retried after a short pause, never fatal;
// - connections stop being accepted before the process runs out of descriptors: a connection
//   whose descriptor lands in the reserve (the top `reserve` below the soft limit) is closed at
//   once. Descriptors are allocated lowest-first, so a descriptor that high means every one below
//   it is taken; other users of descriptors (files, the HTTP API, gRPC's own) keep the reserve;
// - at most `max_connections` are open at once (server.connections.grpc_max_connections): each
//   costs ~17 KB while open, and gRPC keeps a small object per peak connection for good, which
//   pins freed pages, so the cap also bounds what a burst leaves behind (docs/SERVING.md).
// TLS connections cannot be handed over this way: with TLS, gRPC keeps its own listener and a
// failed accept takes the server's fatal path instead (server.cc).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/handed_sockets.h"

namespace grpc {
class Server;
}

namespace specula {

class GrpcAcceptor {
 public:
  struct Options {
    // Accepted descriptors numbered at or above this are closed at once (RLIMIT_NOFILE's soft
    // limit minus the reserve).
    int descriptor_ceiling = 0;
    // Connections handed to gRPC and still open, at most; 0 = no limit.
    int max_connections = 0;
    // Called on the acceptor's thread for each connection closed at once, with the reason
    // ("descriptor_reserve" or "connection_limit"), and each failed accept (metrics); may be
    // empty.
    std::function<void(const char* reason)> on_refused;
    std::function<void()> on_accept_error;
  };

  // Binds and listens on "HOST:PORT" (port 0 picks one). UNAVAILABLE naming server.listen when
  // the address cannot be bound (in use, not local).
  static absl::StatusOr<std::unique_ptr<GrpcAcceptor>> Listen(const std::string& host_port);
  ~GrpcAcceptor();  // Stop()
  GrpcAcceptor(const GrpcAcceptor&) = delete;
  GrpcAcceptor& operator=(const GrpcAcceptor&) = delete;

  int port() const { return port_; }
  // Starts accepting for `server` (started, and outliving Stop()).
  void Start(grpc::Server* server, Options options);
  // Stops accepting and closes the listening socket; connections already handed over stay
  // gRPC's. Idempotent.
  void Stop();

  // The soft RLIMIT_NOFILE minus the reserve this server keeps for everything but gRPC
  // connections: max(64, limit / 8).
  static int DefaultDescriptorCeiling();

 private:
  GrpcAcceptor(int listen_fd, int wake_fd, int port)
      : listen_fd_(listen_fd), wake_fd_(wake_fd), port_(port) {}
  void Loop();
  // Accepts what is pending; false after a failed accept, which calls for a pause.
  bool AcceptPending();
  // Whether a new connection would pass max_connections. Counting the open ones costs a look
  // at each, so at the limit the answer is reused for a short while.
  bool AtConnectionLimit();
  // Closes `fd` at once, counted under `reason`.
  void Refuse(int fd, const char* reason, const std::string& why);
  // A warning line, at most every 10 s (the counters keep the exact numbers).
  void MaybeLog(const char* event, const std::string& why);

  int listen_fd_;
  int wake_fd_;  // eventfd: Stop() wakes the loop
  int port_;
  grpc::Server* server_ = nullptr;
  Options options_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  // The acceptor thread's, for its log lines (the metrics count through the options).
  int64_t refused_ = 0;
  int64_t accept_errors_ = 0;
  absl::Time last_log_ = absl::InfinitePast();
  HandedSockets handed_;
  // When CountOpen last found the limit.
  std::chrono::steady_clock::time_point last_full_count_{};
};

}  // namespace specula
