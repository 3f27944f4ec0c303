// The prefix index of the KV cache (docs/SESSIONS.md): a trie over page-sized token blocks. The
// node at depth d holds the KV pages of tokens [(d-1) * page_size, d * page_size) computed after
// the tokens on its path, so the path from the root to a node is a token prefix whose KV is
// cached. Children are looked up by the block's tokens themselves (a hash map whose keys are
// compared element by element), so a match is verified token by token, never by a hash alone.
//
// Each node holds `pages_per_block` page ids of one pool (the dense KV pool: one block; the host
// store: one page per layer and KV head) and one reference to each, taken through the pool's
// `retain` when the node is inserted and dropped through `release` when it is evicted.
//
// A block whose page is only partly filled (the last page of a finished request: kv_len is
// rarely a multiple of the page size) is a *tail*: a leaf with fewer than page_size tokens,
// kept in its parent's `tails`. A tail is never extended in place: a request that reuses it (or
// the first tokens of any child block, MatchTail) copies its page into a block of its own and
// writes from there (copy-on-write), so cached pages stay immutable.
//
// Locks keep pages from eviction, each on a whole path (a node is locked at least as often as
// any descendant): a running sequence locks the prefix it reuses, a session the KV of its last
// turn. Unlocked leaves are evicted least recently used first. Two lock kinds let the owner tell
// pages a running request reads (never evicted) from pages only idle sessions keep (released
// when their session is dropped).
//
// Not thread-safe: the engine thread owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/types/span.h"

namespace specula {

class PrefixTree {
 public:
  struct Node;
  enum class LockKind { kRunning, kSession };
  struct PagePool {
    std::function<void(absl::Span<const int32_t>)> retain;
    std::function<void(absl::Span<const int32_t>)> release;
  };

  PrefixTree(int32_t page_size, int32_t pages_per_block, PagePool pool);
  // Releases the tree's reference to every page it holds.
  ~PrefixTree();
  PrefixTree(const PrefixTree&) = delete;
  PrefixTree& operator=(const PrefixTree&) = delete;

  int32_t page_size() const { return page_size_; }
  int32_t pages_per_block() const { return pages_per_block_; }

  // The deepest node whose path equals the first blocks of `tokens`, at most `max_blocks` deep;
  // null when not even the first block is cached.
  Node* Match(absl::Span<const int32_t> tokens, int64_t max_blocks) const;
  // The child block (a full child or a tail) of `parent` (null: the root) sharing the longest
  // run of first tokens with `rest`, at most `max_tokens` of them and fewer than a page (a whole
  // page is Match's). Its page is a copy source: the caller copies it before anything can evict
  // it (or holds a reference of its own).
  struct TailMatch {
    const Node* node = nullptr;
    int64_t tokens = 0;
  };
  TailMatch MatchTail(const Node* parent, absl::Span<const int32_t> rest,
                      int64_t max_tokens) const;
  // Pages on the path to `node` that no running sequence locks: the part of reclaimable_pages()
  // that locking this path would take away.
  int64_t UnrunPathPages(const Node* node) const;
  // Blocks on the path to `node` (0 for null), a tail counting as one.
  static int64_t Depth(const Node* node);
  // Tokens on the path to `node` (0 for null): whole pages, plus a tail's own tokens.
  int64_t Tokens(const Node* node) const;
  // The pages on the path to `node`, block-major: Depth(node) * pages_per_block ids.
  void PathPages(const Node* node, std::vector<int32_t>* out) const;

  // Lock/unlock the path to `node` (null: nothing). Locking marks the path as just used.
  void Lock(Node* node, LockKind kind);
  void Unlock(Node* node, LockKind kind);

  // Caches blocks [0, blocks) of `tokens`: blocks already in the tree are kept (their pages
  // win), the others become nodes holding `pages_of(i)` (pages_per_block ids, retained). Marks
  // the path as just used and returns its deepest node (null when `blocks` is 0).
  Node* Insert(absl::Span<const int32_t> tokens, int64_t blocks,
               absl::FunctionRef<absl::Span<const int32_t>(int64_t block)> pages_of);
  // Caches `tokens` (1 to page_size - 1 of them) as a tail of `parent` (null: the root), whose
  // page is `pages` (retained). An equal tail already there wins; unlocked tails whose tokens
  // start the new one are evicted (it holds all they hold). Returns the tail.
  Node* InsertTail(Node* parent, absl::Span<const int32_t> tokens,
                   absl::Span<const int32_t> pages);

  // Evicts `node` if it is an unlocked tail whose tokens start a sibling (a block or a longer
  // tail): everything it holds is there too. A session's last tail once its next turn moved on.
  void DropIfDominated(Node* node);
  // Evicts unlocked leaves, least recently used first, until at least `pages` pages were
  // released or nothing unlocked is left. Returns the pages released.
  int64_t Evict(int64_t pages);
  // Evicts `node` and then its ancestors while each is an unlocked leaf (a session's KV leaving
  // at once). Returns the pages released.
  int64_t EvictPath(Node* node);

  int64_t cached_pages() const { return cached_pages_; }
  // Pages no lock holds: Evict can release them.
  int64_t evictable_pages() const { return evictable_pages_; }
  // Pages no running sequence holds: evictable once the sessions holding them are dropped.
  int64_t reclaimable_pages() const { return reclaimable_pages_; }

 private:
  bool EvictableLeaf(const Node* node) const;
  void Remove(Node* leaf);
  Node* NewNode(Node* parent, absl::Span<const int32_t> tokens, absl::Span<const int32_t> pages);
  // Evicts the unlocked tails of `parent` whose tokens start `tokens` (a new block or tail that
  // holds everything they hold).
  void DropTailsStarting(Node* parent, absl::Span<const int32_t> tokens);

  const int32_t page_size_;
  const int32_t pages_per_block_;
  const PagePool pool_;
  std::unique_ptr<Node> root_;
  uint64_t clock_ = 0;  // logical time of the last use, for LRU
  int64_t cached_pages_ = 0;
  int64_t evictable_pages_ = 0;
  int64_t reclaimable_pages_ = 0;
};

struct PrefixTree::Node {
  std::vector<int32_t> tokens;  // page_size tokens (the map key in the parent points here), or
                                // fewer for a tail
  std::vector<int32_t> pages;   // pages_per_block page ids
  Node* parent = nullptr;
  int64_t depth = 0;
  int32_t running_locks = 0;
  int32_t session_locks = 0;
  uint64_t last_use = 0;
  absl::flat_hash_map<absl::Span<const int32_t>, std::unique_ptr<Node>> children;
  std::vector<std::unique_ptr<Node>> tails;  // partly filled last pages that follow this path
  bool tail = false;                         // fewer than page_size tokens; a leaf
};

}  // namespace specula
