#include "engine/kv/prefix_tree.h"

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

int64_t PrefixTree::Depth(const Node* node) { return node == nullptr ? 0 : node->depth; }

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
    if (it == node->children.end()) {
      auto child = std::make_unique<Node>();
      child->tokens.assign(key.begin(), key.end());
      const absl::Span<const int32_t> pages = pages_of(b);
      CHECK_EQ(static_cast<int64_t>(pages.size()), pages_per_block_);
      child->pages.assign(pages.begin(), pages.end());
      pool_.retain(child->pages);
      child->parent = node;
      child->depth = node->depth + 1;
      cached_pages_ += pages_per_block_;
      evictable_pages_ += pages_per_block_;
      reclaimable_pages_ += pages_per_block_;
      const absl::Span<const int32_t> own_key(child->tokens);
      it = node->children.emplace(own_key, std::move(child)).first;
    }
    node = it->second.get();
    node->last_use = clock_;
  }
  return node == root_.get() ? nullptr : node;
}

void PrefixTree::Remove(Node* leaf) {
  CHECK(leaf->children.empty() && leaf->running_locks + leaf->session_locks == 0);
  pool_.release(leaf->pages);
  cached_pages_ -= pages_per_block_;
  evictable_pages_ -= pages_per_block_;
  reclaimable_pages_ -= pages_per_block_;
  Node* parent = leaf->parent;
  parent->children.erase(absl::Span<const int32_t>(leaf->tokens));  // destroys `leaf`
}

bool PrefixTree::EvictableLeaf(const Node* n) const {
  return n != root_.get() && n->children.empty() && n->running_locks + n->session_locks == 0;
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
