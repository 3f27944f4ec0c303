// KV reuse across requests (docs/SESSIONS.md): finished requests leave their full KV pages in a
// prefix index, and a new request whose prompt starts with the same tokens reuses them and
// prefills only the rest. Two indexes, one per place KV lives: blocks of the KV pool (dense
// requests' KV) and pages of the host store (sparse requests' KV, and dense sessions' KV
// offloaded between turns). A sparse request reuses host pages in place; a dense one reuses
// either, taking the longer hit: pool blocks in place, host pages copied into fresh blocks.
//
// Sessions name a conversation: the KV of a session's last turn is locked under its id, so it
// survives until the session is deleted, stays idle past its TTL, or is dropped (least recently
// used first) because a request needs the space. With a host store, a dense turn's KV moves
// there when the turn ends (BeginOffload/FinishOffload), so idle sessions hold host memory only
// and the KV pool is left to running requests. Without a session, cached pages are kept only
// while nothing else needs the memory (kv_cache.prefix_cache).
//
// Not thread-safe: the engine thread owns it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/kv/host_kv_store.h"
#include "engine/kv/kv_pool.h"
#include "engine/kv/prefix_tree.h"

namespace specula {

struct PrefixCacheOptions {
  // kv_cache.prefix_cache: cache the KV of requests without a session too.
  bool cache_sessionless = false;
  // kv_cache.session_ttl_seconds: an idle session's KV is freed after this long.
  absl::Duration session_ttl = absl::Minutes(15);
  // kv_cache.max_sessions: a new session beyond this many drops the least recently used idle
  // one, KV or not (sessions that hold no KV would otherwise pile up until their TTL).
  int64_t max_sessions = 10000;
};

// Why cached pages left the cache (metrics label).
enum class EvictionReason {
  kCapacity,
  kSessionTtl,
  kSessionDeleted,
  kSessionDropped,  // for a request's room
  kSessionLimit,    // for a new session, past kv_cache.max_sessions
};
inline constexpr int kEvictionReasons = 5;
const char* EvictionReasonName(EvictionReason reason);

// What a running request reuses; locked until PrefixCache::Finish.
struct PrefixHit {
  bool sparse = false;  // the request's own KV is host pages (it caches into the host index)
  bool host = false;    // the hit is in the host index (for a dense request: copied in)
  PrefixTree::Node* node = nullptr;  // the whole pages reused (locked)
  int64_t tokens = 0;  // prompt tokens whose KV came from the cache, the tail's included
  // Copy-on-write (dense requests only): the next `tail_tokens` tokens after the node's path are
  // the first tokens of the cached block `tail_pages` (in the hit's index), which the request
  // copies into its own first fresh block and writes on from there. Not locked: the copy is
  // made at admission.
  int64_t tail_tokens = 0;
  std::vector<int32_t> tail_pages;
  std::string session_id;
};

struct SessionInfo {
  std::string id;
  int64_t tokens = 0;   // cached tokens of its last turn (its tail included)
  int64_t bytes = 0;    // KV bytes those tokens take (pages shared with others counted fully)
  bool in_host = false;  // host store (true) or KV pool (false)
  bool running = false;
  absl::Time last_use;
};

struct PrefixCacheCounters {
  std::array<int64_t, kEvictionReasons> evicted_pages = {};  // by EvictionReason, cumulative
  int64_t sessions = 0;
  int64_t session_bytes = 0;
};

class PrefixCache {
 public:
  // `host` may be null (no host store). Both must outlive the PrefixCache.
  PrefixCache(const PrefixCacheOptions& options, KvPool& pool, HostKvStore* host);
  ~PrefixCache();

  // The cached prefix of `prompt` for a request of `sparse` kind (BestMatch), locked: at most
  // prompt - 1 tokens (the last prompt token is always computed, for its logits). No hit when
  // the request has no session and sessionless caching is off. FAILED_PRECONDITION when the
  // session already has a request running; RESOURCE_EXHAUSTED when the session is new,
  // max_sessions exist and every one has a request running.
  absl::StatusOr<PrefixHit> Begin(bool sparse, absl::Span<const int32_t> prompt,
                                  const std::string& session_id);
  // A preempted request comes back: the cached prefix of all its `tokens` (what Park left and
  // eviction spared), locked again. Its session stays running throughout.
  PrefixHit Resume(bool sparse, absl::Span<const int32_t> tokens, const std::string& session_id);
  // A running request is preempted: its first `blocks` full blocks enter the index unlocked
  // (evictable: kept if nothing needs the room), whatever kv_cache.prefix_cache says, and its
  // hit is unlocked.
  void Park(PrefixHit& hit, absl::Span<const int32_t> tokens, int64_t blocks,
            absl::FunctionRef<absl::Span<const int32_t>(int64_t block)> pages_of);
  // The hit's length without locking anything (admission checks).
  // With `always`, as Resume matches (whatever kv_cache.prefix_cache says).
  struct Peek {
    int64_t tokens = 0;             // cached tokens the request would reuse
    bool host = false;              // in the host index (a dense request copies them in)
    int64_t reclaimable_after = 0;  // reclaimable pages of that index once it locks them
  };
  Peek PeekHit(bool sparse, absl::Span<const int32_t> prompt, const std::string& session_id,
               bool always = false) const;
  // The hit's pages, block-major (pool: one block per page-size tokens; host: layers x KV heads
  // pages per block).
  void HitPages(const PrefixHit& hit, std::vector<int32_t>* out) const;

  // The request ends. With `kv_valid`, its first `blocks` full blocks of `tokens` (whose pages
  // `pages_of(block)` gives) enter the index and, for a session, become its KV; in the dense
  // index, tokens past them (fewer than a page) enter as a tail whose page is pages_of(blocks).
  // Unlocks the hit.
  void Finish(PrefixHit& hit, bool kv_valid, absl::Span<const int32_t> tokens, int64_t blocks,
              absl::FunctionRef<absl::Span<const int32_t>(int64_t block)> pages_of, absl::Time now);

  // Offload (a dense session's turn ends, with a host store): the host pages for the blocks of
  // `tokens` (`blocks` whole ones, then a tail) that the host index lacks, freed by evicting if
  // needed. The caller copies blocks [first_block, end) into `pages` (block-major), then calls
  // FinishOffload. Null when the request is not a dense session's or the room is not there (it
  // finishes as before then: Finish caches it in the pool's index).
  struct Offload {
    PrefixTree::Node* present = nullptr;  // the host index's match of the first blocks (locked)
    int64_t first_block = 0;
    int64_t end_block = 0;   // `blocks`, plus one for a tail
    HostKvSequence pages;    // page i of (layer, head) holds block first_block + i
    // The pages block-major, as KvPool::CopyToHost takes them.
    std::vector<int32_t> block_major;
  };
  std::unique_ptr<Offload> BeginOffload(const PrefixHit& hit, absl::Span<const int32_t> tokens,
                                        int64_t blocks);
  // After the copies are enqueued (on the stream every later reader waits for): the blocks enter
  // the host index, and the session's KV is them; unlocks the hit.
  void FinishOffload(PrefixHit& hit, Offload& offload, absl::Span<const int32_t> tokens,
                     int64_t blocks, absl::Time now);

  // Frees cache until `blocks` KV-pool blocks and `host_pages` host pages are free, evicting
  // unlocked pages least recently used first, then dropping idle sessions least recently used
  // first. False when even that is not enough (nothing locked is touched).
  bool MakeRoom(int64_t blocks, int64_t host_pages);
  // Pool blocks / host pages a MakeRoom could free (not read by a running request).
  int64_t reclaimable_blocks() const { return dense_.reclaimable_pages(); }
  int64_t reclaimable_host_pages() const;
  // Cached pages nothing locks (free for admission; excluded from "used" accounting).
  int64_t evictable_blocks() const { return dense_.evictable_pages(); }
  int64_t evictable_host_pages() const;

  // Sessions idle past the TTL are freed. Returns how many.
  int ExpireSessions(absl::Time now);
  // NOT_FOUND for an unknown id; FAILED_PRECONDITION while a request of it runs.
  absl::Status DeleteSession(const std::string& id);
  // Up to `limit` sessions whose ids sort after `after` (all when empty), in id order; `more`
  // when others follow.
  struct SessionPage {
    std::vector<SessionInfo> sessions;
    bool more = false;
  };
  SessionPage ListSessions(const std::string& after, int64_t limit) const;
  // The soonest time a session can expire (InfiniteFuture when none is idle).
  absl::Time NextExpiry() const;

  const PrefixCacheCounters& counters() const { return counters_; }

 private:
  struct Session {
    bool host = false;                 // its KV is in the host index
    PrefixTree::Node* node = nullptr;  // locked kSession; null when it cached nothing
    bool running = false;
    absl::Time last_use;
  };
  PrefixTree& tree(bool host) { return host ? *host_tree_ : dense_; }
  const PrefixTree* tree_or_null(bool host) const { return host ? host_tree_.get() : &dense_; }
  int64_t MaxHitBlocks(absl::Span<const int32_t> prompt) const;
  // The longest hit of `tokens` for a request of `sparse` kind: the host index for a sparse
  // request; for a dense one the pool's, or the host's when that is longer.
  struct HitMatch {
    bool host = false;
    PrefixTree::Node* node = nullptr;
    PrefixTree::TailMatch tail;
    int64_t tokens = 0;
  };
  HitMatch BestMatch(bool sparse, absl::Span<const int32_t> tokens) const;
  HitMatch MatchIn(bool host, bool sparse, absl::Span<const int32_t> tokens) const;
  void MatchAndLock(absl::Span<const int32_t> tokens, PrefixHit* hit);
  // Inserts `tokens` (whole blocks, then a tail unless the pages are a sparse request's) and
  // returns the deepest node.
  PrefixTree::Node* Cache(bool host, bool tail, absl::Span<const int32_t> tokens, int64_t blocks,
                          absl::FunctionRef<absl::Span<const int32_t>(int64_t block)> pages_of);
  // The turn ends: the hit is unlocked and the session's KV becomes `cached` (in the host index
  // or the pool's), unless that is null (a failed turn keeps the last one).
  void EndTurn(PrefixHit& hit, PrefixTree::Node* cached, bool host, absl::Time now);
  bool Caches(const std::string& session_id) const {
    return !session_id.empty() || options_.cache_sessionless;
  }
  using Sessions = absl::btree_map<std::string, Session>;  // ordered: ListSessions pages by id
  // The session named `id`, created (dropping the least recently used idle one past
  // max_sessions) when new.
  absl::StatusOr<Sessions::iterator> FindOrCreateSession(const std::string& id);
  // Unlocks the session's KV and frees what nothing else holds; erases it. Returns the next one.
  Sessions::iterator DropSession(Sessions::iterator it, EvictionReason reason);
  // The least recently used session without a running request that `eligible` accepts.
  template <typename Eligible>
  Sessions::iterator LeastRecentlyUsedIdle(Eligible eligible);
  // The least recently used session, with a running turn or without, that `eligible` accepts.
  template <typename Eligible>
  Sessions::iterator LeastRecentlyUsed(bool running, Eligible eligible);
  // Lets go of the session's KV (its last turn's); pages others hold stay. The session stays.
  void ReleaseSessionKv(Session& s, EvictionReason reason);
  int64_t SessionBytes(const Session& s) const;
  // Evicts unlocked leaves for `pages` pages; returns the pages that left the index.
  int64_t Evict(bool host, int64_t pages, EvictionReason reason);
  int64_t BytesPerBlock(bool host) const;

  PrefixCacheOptions options_;
  KvPool& pool_;
  HostKvStore* host_;
  PrefixTree dense_;                        // KV-pool blocks
  std::unique_ptr<PrefixTree> host_tree_;  // host pages; null without a host store
  Sessions sessions_;
  PrefixCacheCounters counters_;
};

}  // namespace specula
