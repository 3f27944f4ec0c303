#include "engine/kv/prefix_cache.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "engine/common/check.h"
#include "engine/common/status_macros.h"

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
    case EvictionReason::kSessionLimit:
      return "session_limit";
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
    host_tree_ = std::make_unique<PrefixTree>(
        host->page_size(), host->num_layers() * host->num_kv_heads(), HostPages(*host));
  }
}

PrefixCache::~PrefixCache() = default;

int64_t PrefixCache::MaxHitBlocks(absl::Span<const int32_t> prompt) const {
  return prompt.empty() ? 0 : (static_cast<int64_t>(prompt.size()) - 1) / pool_.page_size();
}

PrefixCache::HitMatch PrefixCache::MatchIn(bool host, bool sparse,
                                           absl::Span<const int32_t> tokens) const {
  HitMatch m;
  m.host = host;
  const PrefixTree* t = tree_or_null(host);
  if (t == nullptr) return m;
  m.node = t->Match(tokens, MaxHitBlocks(tokens));
  // Tails are for dense requests, which copy them: a sparse request's pages are used in place.
  // A tail only extends a hit of whole pages: a few first tokens every chat prompt shares (BOS,
  // the template's opening) are not worth a block copy, nor reporting as cached.
  if (!sparse && m.node != nullptr && !tokens.empty()) {
    const int64_t skip = t->Tokens(m.node);
    m.tail = t->MatchTail(m.node, tokens.subspan(skip),
                          static_cast<int64_t>(tokens.size()) - 1 - skip);
  }
  m.tokens = t->Tokens(m.node) + m.tail.tokens;
  return m;
}

PrefixCache::HitMatch PrefixCache::BestMatch(bool sparse, absl::Span<const int32_t> tokens) const {
  if (sparse) return MatchIn(/*host=*/true, sparse, tokens);
  HitMatch pool = MatchIn(/*host=*/false, sparse, tokens);
  if (host_tree_ == nullptr) return pool;
  // Pool blocks are reused in place; host pages cost a copy, so they win only when longer.
  HitMatch host = MatchIn(/*host=*/true, sparse, tokens);
  return host.tokens > pool.tokens ? host : pool;
}

PrefixCache::Peek PrefixCache::PeekHit(bool sparse, absl::Span<const int32_t> prompt,
                                       const std::string& session_id, bool always) const {
  Peek peek;
  // Without a hit, the index whose pages the request's own KV takes (a sparse one's host
  // pages leave every reclaimable pool block reclaimable).
  peek.host = sparse;
  if (sparse && host_tree_ == nullptr) return peek;
  peek.reclaimable_after = tree_or_null(sparse)->reclaimable_pages();
  if (!always && !Caches(session_id)) return peek;
  const HitMatch m = BestMatch(sparse, prompt);
  const PrefixTree* t = tree_or_null(m.host);
  peek.tokens = m.tokens;
  peek.host = m.host;
  peek.reclaimable_after = t->reclaimable_pages();
  // The tail is not locked, but the request holds its page until the copy is made.
  peek.reclaimable_after -= t->UnrunPathPages(m.tail.node != nullptr ? m.tail.node : m.node);
  return peek;
}

absl::StatusOr<PrefixHit> PrefixCache::Begin(bool sparse, absl::Span<const int32_t> prompt,
                                             const std::string& session_id) {
  CHECK(!sparse || host_tree_ != nullptr);
  PrefixHit hit;
  hit.sparse = sparse;
  hit.host = sparse;
  hit.session_id = session_id;
  if (!session_id.empty()) {
    ASSIGN_OR_RETURN(Sessions::iterator it, FindOrCreateSession(session_id));
    Session& s = it->second;
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

absl::StatusOr<PrefixCache::Sessions::iterator> PrefixCache::FindOrCreateSession(
    const std::string& id) {
  if (auto it = sessions_.find(id); it != sessions_.end()) return it;
  if (static_cast<int64_t>(sessions_.size()) >= options_.max_sessions) {
    auto oldest = LeastRecentlyUsedIdle([](const Session&) { return true; });
    if (oldest == sessions_.end()) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "kv_cache.max_sessions (%d) sessions exist and each has a request running; retry "
          "when one ends",
          options_.max_sessions));
    }
    DropSession(oldest, EvictionReason::kSessionLimit);
  }
  auto it = sessions_.emplace(id, Session{}).first;
  counters_.sessions = static_cast<int64_t>(sessions_.size());
  return it;
}

template <typename Eligible>
PrefixCache::Sessions::iterator PrefixCache::LeastRecentlyUsedIdle(Eligible eligible) {
  return LeastRecentlyUsed(/*running=*/false, eligible);
}

template <typename Eligible>
PrefixCache::Sessions::iterator PrefixCache::LeastRecentlyUsed(bool running, Eligible eligible) {
  auto oldest = sessions_.end();
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
    const Session& s = it->second;
    if (s.running != running || !eligible(s)) continue;
    if (oldest == sessions_.end() || s.last_use < oldest->second.last_use) oldest = it;
  }
  return oldest;
}

void PrefixCache::MatchAndLock(absl::Span<const int32_t> tokens, PrefixHit* hit) {
  const HitMatch m = BestMatch(hit->sparse, tokens);
  hit->host = m.host;
  hit->node = m.node;
  hit->tail_tokens = m.tail.tokens;
  hit->tail_pages.clear();
  if (m.tail.node != nullptr) hit->tail_pages = m.tail.node->pages;
  hit->tokens = m.tokens;
  tree(m.host).Lock(hit->node, PrefixTree::LockKind::kRunning);
}

PrefixTree::Node* PrefixCache::Cache(
    bool host, bool tail, absl::Span<const int32_t> tokens, int64_t blocks,
    absl::FunctionRef<absl::Span<const int32_t>(int64_t block)> pages_of) {
  PrefixTree& t = tree(host);
  PrefixTree::Node* node = t.Insert(tokens, blocks, pages_of);
  const auto whole = blocks * t.page_size();
  // Only after a whole page: MatchTail never looks for a tail of the root.
  if (tail && node != nullptr && static_cast<int64_t>(tokens.size()) > whole) {
    node = t.InsertTail(node, tokens.subspan(whole), pages_of(blocks));
  }
  return node;
}

PrefixHit PrefixCache::Resume(bool sparse, absl::Span<const int32_t> tokens,
                              const std::string& session_id) {
  CHECK(!sparse || host_tree_ != nullptr);
  PrefixHit hit;
  hit.sparse = sparse;
  hit.host = sparse;
  hit.session_id = session_id;
  MatchAndLock(tokens, &hit);
  return hit;
}

void PrefixCache::Park(PrefixHit& hit, absl::Span<const int32_t> tokens, int64_t blocks,
                       absl::FunctionRef<absl::Span<const int32_t>(int64_t block)> pages_of) {
  // The request's own pages go to the index of their kind; the hit may be in the other.
  PrefixTree& own = tree(hit.sparse);
  // A request that does not cache parks whole pages only: Finish evicts its path, which a tail
  // below it would keep (a node with tails is not a leaf).
  const int64_t parked = Caches(hit.session_id)
                             ? static_cast<int64_t>(tokens.size())
                             : std::min<int64_t>(tokens.size(), blocks * own.page_size());
  Cache(hit.sparse, !hit.sparse, tokens.subspan(0, parked), blocks, pages_of);
  tree(hit.host).Unlock(hit.node, PrefixTree::LockKind::kRunning);
  hit.host = hit.sparse;
  hit.node = nullptr;
  hit.tokens = 0;
  hit.tail_tokens = 0;
  hit.tail_pages.clear();
}

void PrefixCache::HitPages(const PrefixHit& hit, std::vector<int32_t>* out) const {
  const PrefixTree* t = tree_or_null(hit.host);
  CHECK(t != nullptr);
  t->PathPages(hit.node, out);
}

void PrefixCache::Finish(PrefixHit& hit, bool kv_valid, absl::Span<const int32_t> tokens,
                         int64_t blocks,
                         absl::FunctionRef<absl::Span<const int32_t>(int64_t block)> pages_of,
                         absl::Time now) {
  PrefixTree::Node* cached = nullptr;
  if (kv_valid && Caches(hit.session_id)) {
    cached = Cache(hit.sparse, !hit.sparse, tokens, blocks, pages_of);
  }
  EndTurn(hit, cached, hit.sparse, now);
}

std::unique_ptr<PrefixCache::Offload> PrefixCache::BeginOffload(
    const PrefixHit& hit, absl::Span<const int32_t> tokens, int64_t blocks) {
  if (host_tree_ == nullptr || hit.sparse || hit.session_id.empty() || blocks == 0) return nullptr;
  auto offload = std::make_unique<Offload>();
  PrefixTree& t = *host_tree_;
  offload->present = t.Match(tokens, blocks);
  offload->first_block = PrefixTree::Depth(offload->present);
  const bool tail = static_cast<int64_t>(tokens.size()) > blocks * t.page_size();
  offload->end_block = blocks + (tail ? 1 : 0);
  const int64_t new_blocks = offload->end_block - offload->first_block;
  // A turn that cannot fit even with every idle session dropped stays in the pool, and the
  // sessions stay too.
  const int64_t already = t.UnrunPathPages(offload->present);
  if (new_blocks * t.pages_per_block() >
      host_->free_pages() + t.reclaimable_pages() - already) {
    return nullptr;
  }
  // Kept while room is made: the blocks already there are not copied again.
  t.Lock(offload->present, PrefixTree::LockKind::kRunning);
  absl::StatusOr<HostKvSequence> pages = absl::ResourceExhaustedError("no room");
  if (MakeRoom(0, new_blocks * t.pages_per_block())) {
    pages = host_->Reserve(new_blocks * t.page_size());
  }
  if (!pages.ok()) {
    t.Unlock(offload->present, PrefixTree::LockKind::kRunning);
    return nullptr;
  }
  offload->pages = *std::move(pages);
  offload->block_major.reserve(new_blocks * t.pages_per_block());
  for (int64_t b = 0; b < new_blocks; ++b) {
    offload->pages.AppendBlockPages(static_cast<int32_t>(b), &offload->block_major);
  }
  return offload;
}

void PrefixCache::FinishOffload(PrefixHit& hit, Offload& offload,
                                absl::Span<const int32_t> tokens, int64_t blocks, absl::Time now) {
  const int64_t ppb = host_tree_->pages_per_block();
  auto pages_of = [&](int64_t block) -> absl::Span<const int32_t> {
    CHECK(block >= offload.first_block && block < offload.end_block)
        << "the host index changed between BeginOffload and FinishOffload";
    return absl::MakeConstSpan(offload.block_major).subspan((block - offload.first_block) * ppb,
                                                            ppb);
  };
  PrefixTree::Node* cached = Cache(/*host=*/true, /*tail=*/true, tokens, blocks, pages_of);
  host_->Release(offload.pages);  // the index holds its own references
  host_tree_->Unlock(offload.present, PrefixTree::LockKind::kRunning);
  EndTurn(hit, cached, /*host=*/true, now);
}

void PrefixCache::EndTurn(PrefixHit& hit, PrefixTree::Node* cached, bool host, absl::Time now) {
  PrefixTree& t = tree(hit.host);
  t.Unlock(hit.node, PrefixTree::LockKind::kRunning);
  // A request that does not cache can still have hit pages it parked when preempted: they go
  // with it (unless something else holds them). A hit in the other index is not its own.
  if (!Caches(hit.session_id) && hit.host == hit.sparse) t.EvictPath(hit.node);
  hit.node = nullptr;
  if (!hit.session_id.empty()) {
    auto it = sessions_.find(hit.session_id);
    CHECK(it != sessions_.end() && it->second.running);
    Session& s = it->second;
    s.running = false;
    s.last_use = now;
    // The new turn's KV replaces the last one's; a failed turn keeps the last one.
    if (cached != nullptr) {
      counters_.session_bytes -= SessionBytes(s);
      tree(host).Lock(cached, PrefixTree::LockKind::kSession);
      if (s.node != nullptr) {
        tree(s.host).Unlock(s.node, PrefixTree::LockKind::kSession);
        tree(s.host).DropIfDominated(s.node);  // the last turn's tail, now inside this one
      }
      s.node = cached;
      s.host = host;
      counters_.session_bytes += SessionBytes(s);
    }
  }
}

int64_t PrefixCache::Evict(bool host, int64_t pages, EvictionReason reason) {
  const int64_t released = tree(host).Evict(pages);
  counters_.evicted_pages[static_cast<int>(reason)] += released;
  return released;
}

bool PrefixCache::MakeRoom(int64_t blocks, int64_t host_pages) {
  auto short_of = [&](bool host) -> int64_t {
    if (host) return host_ == nullptr ? 0 : host_pages - host_->free_pages();
    return blocks - pool_.free_blocks();
  };
  // A page leaving the index frees its block only if nothing else holds it (a request keeps the
  // tail it is about to copy): evict until the room is really there or nothing is left to evict.
  auto evict_for = [&](bool host) {
    while (short_of(host) > 0 && Evict(host, short_of(host), EvictionReason::kCapacity) > 0) {
    }
  };
  for (bool host : {false, true}) {
    if (short_of(host) <= 0) continue;
    evict_for(host);
    while (short_of(host) > 0) {
      // The least recently used idle session whose KV is there goes, or else the KV of a
      // session whose turn runs. That KV is only a cache: a running turn keeps the pages it
      // reuses locked by its hit, and a preempted turn resumes from whatever is still cached.
      // Were it kept, preempted session turns could hold each other's room for good.
      auto has_kv = [host](const Session& s) { return s.node != nullptr && s.host == host; };
      if (auto idle = LeastRecentlyUsedIdle(has_kv); idle != sessions_.end()) {
        DropSession(idle, EvictionReason::kSessionDropped);
      } else if (auto busy = LeastRecentlyUsed(/*running=*/true, has_kv);
                 busy != sessions_.end()) {
        ReleaseSessionKv(busy->second, EvictionReason::kSessionDropped);
      } else {
        return false;
      }
      // Its pages may hang below pages only the cache holds: those go too if still short.
      evict_for(host);
    }
  }
  return true;
}

int64_t PrefixCache::reclaimable_host_pages() const {
  return host_tree_ == nullptr ? 0 : host_tree_->reclaimable_pages();
}

int64_t PrefixCache::evictable_host_pages() const {
  return host_tree_ == nullptr ? 0 : host_tree_->evictable_pages();
}

PrefixCache::Sessions::iterator PrefixCache::DropSession(Sessions::iterator it,
                                                        EvictionReason reason) {
  CHECK(!it->second.running);
  ReleaseSessionKv(it->second, reason);
  it = sessions_.erase(it);
  counters_.sessions = static_cast<int64_t>(sessions_.size());
  return it;
}

void PrefixCache::ReleaseSessionKv(Session& s, EvictionReason reason) {
  counters_.session_bytes -= SessionBytes(s);
  if (s.node == nullptr) return;
  PrefixTree& t = tree(s.host);
  t.Unlock(s.node, PrefixTree::LockKind::kSession);
  // Pages only this session held are freed now; shared ones stay with their other holders.
  counters_.evicted_pages[static_cast<int>(reason)] += t.EvictPath(s.node);
  s.node = nullptr;
}

int PrefixCache::ExpireSessions(absl::Time now) {
  int expired = 0;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (!it->second.running && now - it->second.last_use >= options_.session_ttl) {
      it = DropSession(it, EvictionReason::kSessionTtl);
      ++expired;
    } else {
      ++it;
    }
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

int64_t PrefixCache::BytesPerBlock(bool host) const {
  return host ? static_cast<int64_t>(host_->page_bytes()) * host_tree_->pages_per_block()
                : static_cast<int64_t>(pool_.bytes_per_block());
}

int64_t PrefixCache::SessionBytes(const Session& s) const {
  const int64_t blocks = PrefixTree::Depth(s.node);
  return blocks == 0 ? 0 : blocks * BytesPerBlock(s.host);
}

PrefixCache::SessionPage PrefixCache::ListSessions(const std::string& after, int64_t limit) const {
  SessionPage page;
  auto it = after.empty() ? sessions_.begin() : sessions_.upper_bound(after);
  for (; it != sessions_.end() && static_cast<int64_t>(page.sessions.size()) < limit; ++it) {
    const Session& s = it->second;
    SessionInfo& info = page.sessions.emplace_back();
    info.id = it->first;
    info.tokens = tree_or_null(s.host)->Tokens(s.node);
    info.bytes = SessionBytes(s);
    info.in_host = s.host;
    info.running = s.running;
    info.last_use = s.last_use;
  }
  page.more = it != sessions_.end();
  return page;
}

}  // namespace specula
