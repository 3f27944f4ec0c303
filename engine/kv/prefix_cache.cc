#include "engine/kv/prefix_cache.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "engine/common/check.h"

namespace specula {

const char* EvictionReasonName(EvictionReason reason) {
  switch (reason) {
    case EvictionReason::kCapacity:
      return "capacity";
    case EvictionReason::kSessionTtl:
      return "session_ttl";
    case EvictionReason::kSessionDeleted:
      return "session_deleted";
    case EvictionReason::kSessionDropped:
      return "session_dropped";
  }
  return "?";
}

namespace {

PrefixTree::PagePool PoolPages(KvPool& pool) {
  return {[&pool](absl::Span<const int32_t> b) { pool.Retain(b); },
          [&pool](absl::Span<const int32_t> b) { pool.Free(b); }};
}

PrefixTree::PagePool HostPages(HostKvStore& host) {
  return {[&host](absl::Span<const int32_t> pages) {
            for (PageId p : pages) host.Retain(p);
          },
          [&host](absl::Span<const int32_t> pages) {
            for (PageId p : pages) host.ReleasePage(p);
          }};
}

}  // namespace

PrefixCache::PrefixCache(const PrefixCacheOptions& options, KvPool& pool, HostKvStore* host)
    : options_(options), pool_(pool), host_(host), dense_(pool.page_size(), 1, PoolPages(pool)) {
  if (host != nullptr) {
    CHECK_EQ(host->page_size(), pool.page_size());
    sparse_ = std::make_unique<PrefixTree>(
        host->page_size(), host->num_layers() * host->num_kv_heads(), HostPages(*host));
  }
}

PrefixCache::~PrefixCache() = default;

int64_t PrefixCache::MaxHitBlocks(absl::Span<const int32_t> prompt) const {
  return prompt.empty() ? 0 : (static_cast<int64_t>(prompt.size()) - 1) / pool_.page_size();
}

PrefixCache::Peek PrefixCache::PeekHit(bool sparse, absl::Span<const int32_t> prompt,
                                       const std::string& session_id, bool always) const {
  Peek peek;
  const PrefixTree* t = tree_or_null(sparse);
  if (t == nullptr) return peek;
  peek.reclaimable_after = t->reclaimable_pages();
  if (!always && !Caches(session_id)) return peek;
  const PrefixTree::Node* node = t->Match(prompt, MaxHitBlocks(prompt));
  const PrefixTree::TailMatch tail = MatchTail(sparse, node, prompt);
  peek.tokens = t->Tokens(node) + tail.tokens;
  // The tail is not locked, but the request holds its page until the copy is made.
  peek.reclaimable_after -= t->UnrunPathPages(tail.node != nullptr ? tail.node : node);
  return peek;
}

PrefixTree::TailMatch PrefixCache::MatchTail(bool sparse, const PrefixTree::Node* node,
                                             absl::Span<const int32_t> tokens) const {
  // Sparse pages are not copied: a sparse request's last page is partly on the device when it
  // ends, and the host store holds only written-back whole pages. A tail only extends a hit of
  // whole pages: a few first tokens every chat prompt shares (BOS, the template's opening) are
  // not worth a block copy, nor reporting as cached.
  if (sparse || node == nullptr || tokens.empty()) return {};
  const int64_t skip = dense_.Tokens(node);
  const int64_t max_tokens = static_cast<int64_t>(tokens.size()) - 1 - skip;
  return dense_.MatchTail(node, tokens.subspan(skip), max_tokens);
}

absl::StatusOr<PrefixHit> PrefixCache::Begin(bool sparse, absl::Span<const int32_t> prompt,
                                             const std::string& session_id) {
  CHECK(!sparse || sparse_ != nullptr);
  PrefixHit hit;
  hit.sparse = sparse;
  hit.session_id = session_id;
  if (!session_id.empty()) {
    Session& s = sessions_[session_id];  // created on first use
    if (s.running) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "session '%s' has a request running; send its next turn after that one finishes",
          session_id));
    }
    s.running = true;
  }
  if (Caches(session_id)) MatchAndLock(prompt, &hit);
  return hit;
}

void PrefixCache::MatchAndLock(absl::Span<const int32_t> tokens, PrefixHit* hit) {
  PrefixTree& t = tree(hit->sparse);
  hit->node = t.Match(tokens, MaxHitBlocks(tokens));
  const PrefixTree::TailMatch tail = MatchTail(hit->sparse, hit->node, tokens);
  hit->tail_tokens = tail.tokens;
  hit->tail_pages.clear();
  if (tail.node != nullptr) hit->tail_pages = tail.node->pages;
  hit->tokens = t.Tokens(hit->node) + tail.tokens;
  t.Lock(hit->node, PrefixTree::LockKind::kRunning);
}

PrefixTree::Node* PrefixCache::Cache(
    bool sparse, absl::Span<const int32_t> tokens, int64_t blocks,
    absl::FunctionRef<absl::Span<const int32_t>(int64_t block)> pages_of) {
  PrefixTree& t = tree(sparse);
  PrefixTree::Node* node = t.Insert(tokens, blocks, pages_of);
  const auto whole = blocks * t.page_size();
  // Only after a whole page: MatchTail never looks for a tail of the root.
  if (!sparse && node != nullptr && static_cast<int64_t>(tokens.size()) > whole) {
    node = t.InsertTail(node, tokens.subspan(whole), pages_of(blocks));
  }
  return node;
}

PrefixHit PrefixCache::Resume(bool sparse, absl::Span<const int32_t> tokens,
                              const std::string& session_id) {
  CHECK(!sparse || sparse_ != nullptr);
  PrefixHit hit;
  hit.sparse = sparse;
  hit.session_id = session_id;
  MatchAndLock(tokens, &hit);
  return hit;
}

void PrefixCache::Park(PrefixHit& hit, absl::Span<const int32_t> tokens, int64_t blocks,
                       absl::FunctionRef<absl::Span<const int32_t>(int64_t block)> pages_of) {
  PrefixTree& t = tree(hit.sparse);
  // A request that does not cache parks whole pages only: Finish evicts its path, which a tail
  // below it would keep (a node with tails is not a leaf).
  const int64_t parked = Caches(hit.session_id)
                             ? static_cast<int64_t>(tokens.size())
                             : std::min<int64_t>(tokens.size(), blocks * t.page_size());
  Cache(hit.sparse, tokens.subspan(0, parked), blocks, pages_of);
  t.Unlock(hit.node, PrefixTree::LockKind::kRunning);
  hit.node = nullptr;
  hit.tokens = 0;
  hit.tail_tokens = 0;
  hit.tail_pages.clear();
}

void PrefixCache::HitPages(const PrefixHit& hit, std::vector<int32_t>* out) const {
  const PrefixTree* t = tree_or_null(hit.sparse);
  CHECK(t != nullptr);
  t->PathPages(hit.node, out);
}

void PrefixCache::Finish(PrefixHit& hit, bool kv_valid, absl::Span<const int32_t> tokens,
                         int64_t blocks,
                         absl::FunctionRef<absl::Span<const int32_t>(int64_t block)> pages_of,
                         absl::Time now) {
  PrefixTree& t = tree(hit.sparse);
  PrefixTree::Node* cached = nullptr;
  if (kv_valid && Caches(hit.session_id)) cached = Cache(hit.sparse, tokens, blocks, pages_of);
  t.Unlock(hit.node, PrefixTree::LockKind::kRunning);
  // A request that does not cache can still have hit pages it parked when preempted: they go
  // with it (unless something else holds them).
  if (!Caches(hit.session_id)) t.EvictPath(hit.node);
  hit.node = nullptr;
  if (!hit.session_id.empty()) {
    auto it = sessions_.find(hit.session_id);
    CHECK(it != sessions_.end() && it->second.running);
    Session& s = it->second;
    s.running = false;
    s.last_use = now;
    // The new turn's KV replaces the last one's; a failed turn keeps the last one.
    if (cached != nullptr) {
      t.Lock(cached, PrefixTree::LockKind::kSession);
      if (s.node != nullptr) {
        tree(s.sparse).Unlock(s.node, PrefixTree::LockKind::kSession);
        tree(s.sparse).DropIfDominated(s.node);  // the last turn's tail, now inside this one
      }
      s.node = cached;
      s.sparse = hit.sparse;
    }
  }
  UpdateSessionBytes();
}

void PrefixCache::Evict(bool sparse, int64_t pages, EvictionReason reason) {
  const int64_t released = tree(sparse).Evict(pages);
  counters_.evicted_pages[static_cast<int>(reason)] += released;
}

bool PrefixCache::MakeRoom(int64_t blocks, int64_t host_pages) {
  auto short_of = [&](bool sparse) -> int64_t {
    if (sparse) return host_ == nullptr ? 0 : host_pages - host_->free_pages();
    return blocks - pool_.free_blocks();
  };
  for (bool sparse : {false, true}) {
    if (short_of(sparse) <= 0) continue;
    Evict(sparse, short_of(sparse), EvictionReason::kCapacity);
    while (short_of(sparse) > 0) {
      // The least recently used idle session of this kind.
      auto oldest = sessions_.end();
      for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
        const Session& s = it->second;
        if (s.running || s.node == nullptr || s.sparse != sparse) continue;
        if (oldest == sessions_.end() || s.last_use < oldest->second.last_use) oldest = it;
      }
      if (oldest == sessions_.end()) return false;
      DropSession(oldest, EvictionReason::kSessionDropped);
      // Its pages may hang below pages only the cache holds: those go too if still short.
      if (short_of(sparse) > 0) Evict(sparse, short_of(sparse), EvictionReason::kCapacity);
    }
  }
  return true;
}

int64_t PrefixCache::reclaimable_host_pages() const {
  return sparse_ == nullptr ? 0 : sparse_->reclaimable_pages();
}

int64_t PrefixCache::evictable_host_pages() const {
  return sparse_ == nullptr ? 0 : sparse_->evictable_pages();
}

void PrefixCache::DropSession(absl::flat_hash_map<std::string, Session>::iterator it,
                              EvictionReason reason) {
  Session& s = it->second;
  CHECK(!s.running);
  if (s.node != nullptr) {
    PrefixTree& t = tree(s.sparse);
    t.Unlock(s.node, PrefixTree::LockKind::kSession);
    // Pages only this session held are freed now; shared ones stay with their other holders.
    counters_.evicted_pages[static_cast<int>(reason)] += t.EvictPath(s.node);
  }
  sessions_.erase(it);
  UpdateSessionBytes();
}

int PrefixCache::ExpireSessions(absl::Time now) {
  int expired = 0;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    auto next = std::next(it);
    if (!it->second.running && now - it->second.last_use >= options_.session_ttl) {
      DropSession(it, EvictionReason::kSessionTtl);
      ++expired;
    }
    it = next;
  }
  return expired;
}

absl::Time PrefixCache::NextExpiry() const {
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [id, s] : sessions_) {
    if (!s.running) next = std::min(next, s.last_use + options_.session_ttl);
  }
  return next;
}

absl::Status PrefixCache::DeleteSession(const std::string& id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrFormat("no session '%s'", id));
  }
  if (it->second.running) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "session '%s' has a request running; delete it after that request ends", id));
  }
  DropSession(it, EvictionReason::kSessionDeleted);
  return absl::OkStatus();
}

int64_t PrefixCache::BytesPerBlock(bool sparse) const {
  return sparse ? static_cast<int64_t>(host_->page_bytes()) * sparse_->pages_per_block()
                : static_cast<int64_t>(pool_.bytes_per_block());
}

std::vector<SessionInfo> PrefixCache::ListSessions() const {
  std::vector<SessionInfo> out;
  out.reserve(sessions_.size());
  for (const auto& [id, s] : sessions_) {
    SessionInfo info;
    info.id = id;
    const int64_t blocks = PrefixTree::Depth(s.node);
    info.tokens = tree_or_null(s.sparse)->Tokens(s.node);
    info.bytes = blocks == 0 ? 0 : blocks * BytesPerBlock(s.sparse);
    info.sparse = s.sparse;
    info.running = s.running;
    info.last_use = s.last_use;
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(),
            [](const SessionInfo& a, const SessionInfo& b) { return a.id < b.id; });
  return out;
}

void PrefixCache::UpdateSessionBytes() {
  counters_.sessions = static_cast<int64_t>(sessions_.size());
  int64_t bytes = 0;
  for (const auto& [id, s] : sessions_) {
    const int64_t blocks = PrefixTree::Depth(s.node);
    if (blocks > 0) bytes += blocks * BytesPerBlock(s.sparse);
  }
  counters_.session_bytes = bytes;
}

}  // namespace specula
