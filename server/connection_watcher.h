// Tells when the peer of a waiting connection goes away. An HTTP connection whose answer is being
// produced reads nothing from its socket, so a client that hangs up while its request is
// generating would only be noticed at the next write (for a non-streaming request: at the very
// end, after all the work).
// This thread waits on those sockets with epoll (EPOLLRDHUP) and reports a hang-up at once, so the
// request is cancelled and its KV freed.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace specula {

class ConnectionWatcher {
 public:
  static absl::StatusOr<std::unique_ptr<ConnectionWatcher>> Start();
  ~ConnectionWatcher();  // stops the thread; pending callbacks are dropped
  ConnectionWatcher(const ConnectionWatcher&) = delete;
  ConnectionWatcher& operator=(const ConnectionWatcher&) = delete;

  // Calls `on_hangup` once, on the watcher's thread, when `fd`'s peer closes or resets the
  // connection, unless Unwatch(id) ran first. The caller keeps `fd` open until it unwatches.
  // Returns the watch's id (0 when epoll refused the descriptor: nothing will be reported).
  uint64_t Watch(int fd, std::function<void()> on_hangup);
  // Stops watching; after it returns, the callback is not running and will not run.
  void Unwatch(uint64_t id);

 private:
  ConnectionWatcher(int epoll_fd, int wake_fd);
  void Run();
  void Fire(uint64_t id);

  const int epoll_fd_;
  const int wake_fd_;  // an eventfd that ends Run
  std::mutex mu_;
  uint64_t next_id_ = 1;
  struct Entry {
    int fd;
    std::function<void()> on_hangup;
  };
  absl::flat_hash_map<uint64_t, Entry> entries_;
  // Serializes callbacks with Unwatch, so Unwatch's return means "not running".
  std::mutex fire_mu_;
  std::thread thread_;
};

}  // namespace specula
