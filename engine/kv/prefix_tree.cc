#include "engine/kv/prefix_tree.h"

#include <algorithm>
#include <queue>
#include <utility>

#include "engine/common/check.h"

namespace specula {

PrefixTree::PrefixTree(int32_t page_size, int32_t pages_per_block, PagePool pool)
    : page_size_(page_size),
      pages_per_block_(pages_per_block),
      pool_(std::move(pool)),
      root_(std::make_unique<Node>()) {
  CHECK(page_size > 0 && pages_per_block > 0);
}

PrefixTree::~PrefixTree() {
  // Locks may remain when the owner goes down with requests running: only the tree's own
  // references are dropped here.
  std::vector<Node*> stack = {root_.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (n != root_.get()) pool_.release(n->pages);
    for (auto& [key, child] : n->children) stack.push_back(child.get());
    for (auto& tail : n->tails) stack.push_back(tail.get());
  }
}

PrefixTree::Node* PrefixTree::Match(absl::Span<const int32_t> tokens, int64_t max_blocks) const {
  Node* node = root_.get();
  const int64_t blocks = std::min<int64_t>(max_blocks, tokens.size() / page_size_);
  for (int64_t b = 0; b < blocks; ++b) {
    auto it = node->children.find(tokens.subspan(b * page_size_, page_size_));
    if (it == node->children.end()) break;
    node = it->second.get();
  }
  return node == root_.get() ? nullptr : node;
}

PrefixTree::TailMatch PrefixTree::MatchTail(const Node* parent, absl::Span<const int32_t> rest,
                                            int64_t max_tokens) const {
  if (parent == nullptr) parent = root_.get();
  const int64_t limit = std::min<int64_t>({max_tokens, static_cast<int64_t>(rest.size()),
                                           page_size_ - 1});
  TailMatch best;
  auto consider = [&](const Node* n) {
    const int64_t span = std::min<int64_t>(limit, static_cast<int64_t>(n->tokens.size()));
    int64_t k = 0;
    while (k < span && n->tokens[k] == rest[k]) ++k;
    if (k > best.tokens) best = {n, k};
  };
  if (limit <= 0) return best;
  for (const auto& tail : parent->tails) consider(tail.get());
  for (const auto& [key, child] : parent->children) consider(child.get());
  return best;
}

int64_t PrefixTree::Depth(const Node* node) { return node == nullptr ? 0 : node->depth; }

int64_t PrefixTree::Tokens(const Node* node) const {
  if (node == nullptr) return 0;
  return node->tail ? (node->depth - 1) * page_size_ + static_cast<int64_t>(node->tokens.size())
                    : node->depth * page_size_;
}

int64_t PrefixTree::UnrunPathPages(const Node* node) const {
  int64_t pages = 0;
  for (; node != nullptr && node != root_.get(); node = node->parent) {
    if (node->running_locks == 0) pages += pages_per_block_;
  }
  return pages;
}

void PrefixTree::PathPages(const Node* node, std::vector<int32_t>* out) const {
  out->assign(static_cast<size_t>(Depth(node)) * pages_per_block_, 0);
  for (; node != nullptr && node != root_.get(); node = node->parent) {
    std::copy(node->pages.begin(), node->pages.end(),
              out->begin() + (node->depth - 1) * pages_per_block_);
  }
}

void PrefixTree::Lock(Node* node, LockKind kind) {
  ++clock_;
  for (; node != nullptr; node = node->parent) {
    const bool was_unlocked = node->running_locks + node->session_locks == 0;
    const bool was_unrun = node->running_locks == 0;
    (kind == LockKind::kRunning ? node->running_locks : node->session_locks)++;
    node->last_use = clock_;
    if (node == root_.get()) continue;
    if (was_unlocked) evictable_pages_ -= pages_per_block_;
    if (was_unrun && kind == LockKind::kRunning) reclaimable_pages_ -= pages_per_block_;
  }
}

void PrefixTree::Unlock(Node* node, LockKind kind) {
  for (; node != nullptr; node = node->parent) {
    int32_t& locks = kind == LockKind::kRunning ? node->running_locks : node->session_locks;
    CHECK_GT(locks, 0) << "prefix tree: unlocking a node more often than it was locked";
    --locks;
    if (node == root_.get()) continue;
    if (node->running_locks + node->session_locks == 0) evictable_pages_ += pages_per_block_;
    if (kind == LockKind::kRunning && node->running_locks == 0) {
      reclaimable_pages_ += pages_per_block_;
    }
  }
}

PrefixTree::Node* PrefixTree::Insert(
    absl::Span<const int32_t> tokens, int64_t blocks,
    absl::FunctionRef<absl::Span<const int32_t>(int64_t block)> pages_of) {
  CHECK_LE(blocks * page_size_, static_cast<int64_t>(tokens.size()));
  ++clock_;
  Node* node = root_.get();
  for (int64_t b = 0; b < blocks; ++b) {
    const absl::Span<const int32_t> key = tokens.subspan(b * page_size_, page_size_);
    auto it = node->children.find(key);
    if (it != node->children.end()) {
      node = it->second.get();
    } else {
      DropTailsStarting(node, key);
      node = NewNode(node, key, pages_of(b));
    }
    node->last_use = clock_;
  }
  return node == root_.get() ? nullptr : node;
}

PrefixTree::Node* PrefixTree::NewNode(Node* parent, absl::Span<const int32_t> tokens,
                                      absl::Span<const int32_t> pages) {
  CHECK_EQ(static_cast<int64_t>(pages.size()), pages_per_block_);
  auto child = std::make_unique<Node>();
  child->tokens.assign(tokens.begin(), tokens.end());
  child->pages.assign(pages.begin(), pages.end());
  pool_.retain(child->pages);
  child->parent = parent;
  child->depth = parent->depth + 1;
  child->tail = static_cast<int64_t>(tokens.size()) < page_size_;
  child->last_use = clock_;
  cached_pages_ += pages_per_block_;
  evictable_pages_ += pages_per_block_;
  reclaimable_pages_ += pages_per_block_;
  Node* raw = child.get();
  if (raw->tail) {
    parent->tails.push_back(std::move(child));
  } else {
    parent->children.emplace(absl::Span<const int32_t>(raw->tokens), std::move(child));
  }
  return raw;
}

namespace {

// Whether `tokens` begins with all of `prefix`: a block or tail holding `tokens` holds everything
// a tail holding `prefix` does.
bool StartsWith(absl::Span<const int32_t> tokens, absl::Span<const int32_t> prefix) {
  return prefix.size() <= tokens.size() && tokens.subspan(0, prefix.size()) == prefix;
}

}  // namespace

void PrefixTree::DropTailsStarting(Node* parent, absl::Span<const int32_t> tokens) {
  std::vector<Node*> dominated;
  for (const auto& tail : parent->tails) {
    if (StartsWith(tokens, tail->tokens) && EvictableLeaf(tail.get())) {
      dominated.push_back(tail.get());
    }
  }
  for (Node* tail : dominated) Remove(tail);
}

void PrefixTree::DropIfDominated(Node* node) {
  if (node == nullptr || !node->tail || !EvictableLeaf(node)) return;
  auto holds_mine = [&](const Node* other) {
    return other != node && StartsWith(other->tokens, node->tokens);
  };
  const Node* parent = node->parent;
  bool dominated = false;
  for (const auto& tail : parent->tails) dominated |= holds_mine(tail.get());
  for (const auto& [key, child] : parent->children) dominated |= holds_mine(child.get());
  if (dominated) Remove(node);
}

PrefixTree::Node* PrefixTree::InsertTail(Node* parent, absl::Span<const int32_t> tokens,
                                         absl::Span<const int32_t> pages) {
  CHECK(!tokens.empty() && static_cast<int64_t>(tokens.size()) < page_size_);
  if (parent == nullptr) parent = root_.get();
  CHECK(!parent->tail);
  ++clock_;
  for (const auto& tail : parent->tails) {
    if (absl::Span<const int32_t>(tail->tokens) == tokens) {
      tail->last_use = clock_;
      return tail.get();
    }
  }
  DropTailsStarting(parent, tokens);
  return NewNode(parent, tokens, pages);
}

void PrefixTree::Remove(Node* leaf) {
  CHECK(leaf->children.empty() && leaf->running_locks + leaf->session_locks == 0);
  pool_.release(leaf->pages);
  cached_pages_ -= pages_per_block_;
  evictable_pages_ -= pages_per_block_;
  reclaimable_pages_ -= pages_per_block_;
  Node* parent = leaf->parent;
  if (leaf->tail) {
    auto& tails = parent->tails;
    tails.erase(std::find_if(tails.begin(), tails.end(),
                             [&](const std::unique_ptr<Node>& t) { return t.get() == leaf; }));
  } else {
    parent->children.erase(absl::Span<const int32_t>(leaf->tokens));  // destroys `leaf`
  }
}

bool PrefixTree::EvictableLeaf(const Node* n) const {
  return n != root_.get() && n->children.empty() && n->tails.empty() &&
         n->running_locks + n->session_locks == 0;
}

int64_t PrefixTree::EvictPath(Node* node) {
  int64_t released = 0;
  while (node != nullptr && EvictableLeaf(node)) {
    Node* parent = node->parent;
    Remove(node);
    released += pages_per_block_;
    node = parent;
  }
  return released;
}

int64_t PrefixTree::Evict(int64_t pages) {
  auto evictable_leaf = [&](const Node* n) { return EvictableLeaf(n); };
  using Entry = std::pair<uint64_t, Node*>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> leaves;  // oldest first
  std::vector<Node*> stack = {root_.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (evictable_leaf(n)) leaves.emplace(n->last_use, n);
    for (auto& [key, child] : n->children) stack.push_back(child.get());
    for (auto& tail : n->tails) stack.push_back(tail.get());
  }
  int64_t released = 0;
  while (released < pages && !leaves.empty()) {
    Node* leaf = leaves.top().second;
    leaves.pop();
    Node* parent = leaf->parent;
    Remove(leaf);
    released += pages_per_block_;
    if (evictable_leaf(parent)) leaves.emplace(parent->last_use, parent);
  }
  return released;
}

}  // namespace specula
