// KV reuse across requests (docs/SESSIONS.md): finished requests leave their full KV pages in a
// prefix index, and a new request whose prompt starts with the same tokens reuses them and
// prefills only the rest. Two indexes, one per place KV lives: dense requests' blocks in the KV
// pool, sparse requests' pages in the host store (a request reuses KV of its own kind).
//
// Sessions name a conversation: the KV of a session's last turn is locked under its id, so it
// survives until the session is deleted, stays idle past its TTL, or is dropped (least recently
// used first) because a request needs the space. Without a session, cached pages are kept only
// while nothing else needs the memory (kv_cache.prefix_cache).
//
// Not thread-safe: the engine thread owns it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
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
};

// Why cached pages left the cache (metrics label).
enum class EvictionReason { kCapacity, kSessionTtl, kSessionDeleted, kSessionDropped };
inline constexpr int kEvictionReasons = 4;
const char* EvictionReasonName(EvictionReason reason);

// What a running request reuses; locked until PrefixCache::Finish.
struct PrefixHit {
  bool sparse = false;
  PrefixTree::Node* node = nullptr;  // the whole pages reused in place (locked)
  int64_t tokens = 0;  // prompt tokens whose KV came from the cache, the tail's included
  // Copy-on-write (dense only): the next `tail_tokens` tokens after the node's path are the first
  // tokens of the cached block `tail_pages`, which the request copies into its own first fresh
  // block and writes on from there. Not locked: the copy is made at admission.
  int64_t tail_tokens = 0;
  std::vector<int32_t> tail_pages;
  std::string session_id;
};

struct SessionInfo {
  std::string id;
  int64_t tokens = 0;   // cached tokens of its last turn (its tail included)
  int64_t bytes = 0;    // KV bytes those tokens take (pages shared with others counted fully)
  bool sparse = false;  // host store (true) or KV pool (false)
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
  // `host` may be null (no sparse cache). Both must outlive the PrefixCache.
  PrefixCache(const PrefixCacheOptions& options, KvPool& pool, HostKvStore* host);
  ~PrefixCache();

  // The cached prefix of `prompt` in the index of `sparse` kind, locked for the request: at most
  // prompt - 1 tokens (the last prompt token is always computed, for its logits). No hit when
  // the request has no session and sessionless caching is off. FAILED_PRECONDITION when the
  // session already has a request running.
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
    int64_t reclaimable_after = 0;  // reclaimable pages of its kind once it locks them
  };
  Peek PeekHit(bool sparse, absl::Span<const int32_t> prompt, const std::string& session_id,
               bool always = false) const;
  // The hit's pages, block-major (dense: one block per page-size tokens; sparse: layers x KV
  // heads host pages per block).
  void HitPages(const PrefixHit& hit, std::vector<int32_t>* out) const;

  // The request ends. With `kv_valid`, its first `blocks` full blocks of `tokens` (whose pages
  // `pages_of(block)` gives) enter the index and, for a session, become its KV; in the dense
  // index, tokens past them (fewer than a page) enter as a tail whose page is pages_of(blocks).
  // Unlocks the hit.
  void Finish(PrefixHit& hit, bool kv_valid, absl::Span<const int32_t> tokens, int64_t blocks,
              absl::FunctionRef<absl::Span<const int32_t>(int64_t block)> pages_of, absl::Time now);

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
  std::vector<SessionInfo> ListSessions() const;
  // The soonest time a session can expire (InfiniteFuture when none is idle).
  absl::Time NextExpiry() const;

  const PrefixCacheCounters& counters() const { return counters_; }

 private:
  struct Session {
    bool sparse = false;
    PrefixTree::Node* node = nullptr;  // locked kSession; null when it cached nothing
    bool running = false;
    absl::Time last_use;
  };
  PrefixTree& tree(bool sparse) { return sparse ? *sparse_ : dense_; }
  const PrefixTree* tree_or_null(bool sparse) const { return sparse ? sparse_.get() : &dense_; }
  int64_t MaxHitBlocks(absl::Span<const int32_t> prompt) const;
  // The tail a request reusing `node`'s path can copy (dense only; none for sparse).
  PrefixTree::TailMatch MatchTail(bool sparse, const PrefixTree::Node* node,
                                  absl::Span<const int32_t> tokens) const;
  void MatchAndLock(absl::Span<const int32_t> tokens, PrefixHit* hit);
  // Inserts `tokens` (whole blocks, then a dense tail) and returns the deepest node.
  PrefixTree::Node* Cache(bool sparse, absl::Span<const int32_t> tokens, int64_t blocks,
                          absl::FunctionRef<absl::Span<const int32_t>(int64_t block)> pages_of);
  bool Caches(const std::string& session_id) const {
    return !session_id.empty() || options_.cache_sessionless;
  }
  // Unlocks the session's KV and frees what nothing else holds; erases it.
  void DropSession(absl::flat_hash_map<std::string, Session>::iterator it, EvictionReason reason);
  void Evict(bool sparse, int64_t pages, EvictionReason reason);
  int64_t BytesPerBlock(bool sparse) const;
  void UpdateSessionBytes();

  PrefixCacheOptions options_;
  KvPool& pool_;
  HostKvStore* host_;
  PrefixTree dense_;
  std::unique_ptr<PrefixTree> sparse_;  // null without a host store
  absl::flat_hash_map<std::string, Session> sessions_;
  PrefixCacheCounters counters_;
};

}  // namespace specula
