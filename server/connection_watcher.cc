#include "server/connection_watcher.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace specula {

absl::StatusOr<std::unique_ptr<ConnectionWatcher>> ConnectionWatcher::Start() {
  const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd < 0) return absl::InternalError(absl::StrCat("epoll_create1: ", strerror(errno)));
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    close(epoll_fd);
    return absl::InternalError(absl::StrCat("eventfd: ", strerror(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;  // id 0 is the wake-up
  if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, wake_fd, &ev) != 0) {
    close(wake_fd);
    close(epoll_fd);
    return absl::InternalError(absl::StrCat("epoll_ctl: ", strerror(errno)));
  }
  std::unique_ptr<ConnectionWatcher> watcher(new ConnectionWatcher(epoll_fd, wake_fd));
  watcher->thread_ = std::thread([w = watcher.get()] { w->Run(); });
  return watcher;
}

ConnectionWatcher::ConnectionWatcher(int epoll_fd, int wake_fd)
    : epoll_fd_(epoll_fd), wake_fd_(wake_fd) {}

ConnectionWatcher::~ConnectionWatcher() {
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
  close(wake_fd_);
  close(epoll_fd_);
}

uint64_t ConnectionWatcher::Watch(int fd, std::function<void()> on_hangup) {
  std::lock_guard lock(mu_);
  const uint64_t id = next_id_++;
  epoll_event ev{};
  // EPOLLRDHUP: the peer closed its side. Hang-up and errors are always reported. One-shot: a
  // connection is reported once.
  ev.events = EPOLLRDHUP | EPOLLONESHOT;
  ev.data.u64 = id;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) return 0;
  entries_.emplace(id, Entry{fd, std::move(on_hangup)});
  return id;
}

void ConnectionWatcher::Unwatch(uint64_t id) {
  if (id == 0) return;
  std::lock_guard fire_lock(fire_mu_);
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;  // already fired
  (void)epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->second.fd, nullptr);
  entries_.erase(it);
}

void ConnectionWatcher::Fire(uint64_t id) {
  std::lock_guard fire_lock(fire_mu_);
  std::function<void()> callback;
  {
    std::lock_guard lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return;  // unwatched meanwhile
    (void)epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->second.fd, nullptr);
    callback = std::move(it->second.on_hangup);
    entries_.erase(it);
  }
  callback();
}

void ConnectionWatcher::Run() {
  epoll_event events[64];
  for (;;) {
    const int n = epoll_wait(epoll_fd_, events, 64, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == 0) return;
      Fire(events[i].data.u64);
    }
  }
}

}  // namespace specula
