#include "server/response_store.h"

#include <algorithm>

namespace specula {

StoredResponse::~StoredResponse() {
  std::shared_ptr<const StoredResponse> next = std::move(previous);
  // Only this link holds `next` (no weak references exist): take its tail before it goes.
  while (next != nullptr && next.use_count() == 1) {
    std::shared_ptr<const StoredResponse> tail =
        std::move(const_cast<StoredResponse&>(*next).previous);
    next = std::move(tail);
  }
}

std::vector<const OrderedJson*> StoredResponse::Conversation() const {
  std::vector<const OrderedJson*> turns;
  for (const StoredResponse* r = this; r != nullptr; r = r->previous.get()) {
    turns.push_back(&r->turn);
  }
  std::reverse(turns.begin(), turns.end());
  return turns;
}

ResponseStore::ResponseStore(int64_t max_stored, absl::Duration ttl)
    : max_stored_(max_stored), ttl_(ttl) {}

void ResponseStore::DropExpired(absl::Time now) {
  while (!lru_.empty()) {
    auto it = entries_.find(lru_.front());
    if (now - it->second.last_used < ttl_) return;
    entries_.erase(it);
    lru_.pop_front();
  }
}

void ResponseStore::Put(std::shared_ptr<const StoredResponse> response, absl::Time now) {
  std::lock_guard lock(mu_);
  DropExpired(now);
  const std::string id = response->id;
  if (auto it = entries_.find(id); it != entries_.end()) {
    lru_.erase(it->second.lru);
    entries_.erase(it);
  }
  while (static_cast<int64_t>(entries_.size()) >= max_stored_) {
    entries_.erase(lru_.front());
    lru_.pop_front();
  }
  lru_.push_back(id);
  entries_.emplace(id, Entry{std::move(response), now, std::prev(lru_.end())});
}

std::shared_ptr<const StoredResponse> ResponseStore::Find(const std::string& id, absl::Time now) {
  std::lock_guard lock(mu_);
  DropExpired(now);
  auto it = entries_.find(id);
  if (it == entries_.end()) return nullptr;
  it->second.last_used = now;
  lru_.splice(lru_.end(), lru_, it->second.lru);
  return it->second.response;
}

bool ResponseStore::Erase(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  lru_.erase(it->second.lru);
  entries_.erase(it);
  return true;
}

int64_t ResponseStore::size() const {
  std::lock_guard lock(mu_);
  return static_cast<int64_t>(entries_.size());
}

}  // namespace specula
