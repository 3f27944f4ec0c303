#include "server/http_connection_guard.h"

#include <sys/socket.h>

#include <algorithm>
#include <utility>

namespace specula {

HttpConnectionGuard::HttpConnectionGuard(HttpConnectionGuardOptions options,
                                         std::function<absl::Time()> now)
    : options_(std::move(options)), now_(std::move(now)) {}

void HttpConnectionGuard::StartSweeper() {
  // Late by at most a quarter of the deadline (and a second), so a 10 s deadline ends a request
  // within 10-11 s.
  sweeper_.emplace(std::clamp(options_.read_timeout / 4, absl::Milliseconds(50), absl::Seconds(1)),
                   [this] { Sweep(); });
}

bool HttpConnectionGuard::Admit(absl::string_view peer) {
  const char* refusal = nullptr;
  bool evicted = false;
  {
    std::lock_guard lock(mu_);
    const auto it = per_peer_.find(peer);
    if (options_.max_per_peer > 0 && it != per_peer_.end() && it->second >= options_.max_per_peer) {
      refusal = "per_ip_limit";
    } else if (OpenLocked() >= options_.max_connections) {
      Entry* victim = EvictionCandidateLocked();
      if (victim == nullptr) {
        refusal = "connection_limit";
      } else {
        ShutLocked(*victim);
        evicted = true;
      }
    }
  }
  if (evicted) Report("evicted", 1);
  if (refusal != nullptr) Report(refusal, 1);
  return refusal == nullptr;
}

void HttpConnectionGuard::Opened(const void* key, int fd, std::string peer) {
  std::lock_guard lock(mu_);
  ++per_peer_[peer];
  Entry& e = entries_[key];
  e.fd = fd;
  e.peer = std::move(peer);
  e.state = State::kReading;
  e.since = now_();
}

void HttpConnectionGuard::RequestStarted(const void* key) { SetState(key, State::kReading); }

void HttpConnectionGuard::RequestRead(const void* key) { SetState(key, State::kAnswering); }

void HttpConnectionGuard::ResponseDone(const void* key) { SetState(key, State::kIdle); }

void HttpConnectionGuard::SetState(const void* key, State state) {
  std::lock_guard lock(mu_);
  const auto it = entries_.find(key);
  // A request started on a connection already reading (its first) keeps the earlier start.
  if (it == entries_.end() || it->second.state == state) return;
  it->second.state = state;
  it->second.since = now_();
}

void HttpConnectionGuard::Closed(const void* key) {
  std::lock_guard lock(mu_);
  const auto it = entries_.find(key);
  if (it == entries_.end()) return;
  if (it->second.shut) --shut_;
  if (auto peer = per_peer_.find(it->second.peer); peer != per_peer_.end() && --peer->second <= 0) {
    per_peer_.erase(peer);
  }
  entries_.erase(it);
}

int HttpConnectionGuard::Sweep() {
  int shut = 0;
  {
    std::lock_guard lock(mu_);
    const absl::Time deadline = now_() - options_.read_timeout;
    for (auto& [key, e] : entries_) {
      if (e.state == State::kReading && !e.shut && e.since <= deadline) {
        ShutLocked(e);
        ++shut;
      }
    }
  }
  Report("read_timeout", shut);
  return shut;
}

int HttpConnectionGuard::open() const {
  std::lock_guard lock(mu_);
  return OpenLocked();
}

void HttpConnectionGuard::ShutLocked(Entry& e) {
  if (e.shut) return;
  e.shut = true;
  ++shut_;
  // The owner still holds the descriptor (Closed comes before it is closed), so this cannot
  // reach a reused number.
  shutdown(e.fd, SHUT_RDWR);
}

HttpConnectionGuard::Entry* HttpConnectionGuard::EvictionCandidateLocked() {
  Entry* victim = nullptr;
  auto rank = [](const Entry& e) { return e.state == State::kIdle ? 0 : 1; };
  for (auto& [key, e] : entries_) {
    if (e.shut || e.state == State::kAnswering) continue;
    if (victim == nullptr || rank(e) < rank(*victim) ||
        (rank(e) == rank(*victim) && e.since < victim->since)) {
      victim = &e;
    }
  }
  return victim;
}

void HttpConnectionGuard::Report(absl::string_view reason, int times) const {
  if (!options_.on_refused) return;
  for (int i = 0; i < times; ++i) options_.on_refused(reason);
}

}  // namespace specula
