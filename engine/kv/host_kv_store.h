// The host-memory backing of the sparse KV cache (docs/ARCHITECTURE.md §4): a fixed-capacity pool
// of pages, each `page_size` tokens of ONE layer and ONE KV head, K [page_size][head_dim] then V
// [page_size][head_dim] in the KV dtype (kv_cache.dtype; the same page layout and element type as
// a KvPool page, so pages move between them as bytes). Every page a request will
// ever need is reserved at admission, so running out is RESOURCE_EXHAUSTED there and never a
// failure mid-request.
//
// Pages are refcounted so sequences and the prefix cache (engine/kv/prefix_tree.h) can share
// prefix pages.
//
// Thread-safety: Reserve, ReserveWithPrefix, Release, Retain, ReleasePage and the accounting
// getters may be called from any thread; they serialize on one mutex. Page *contents* (K, V,
// WriteToken) are not synchronized by the store: the sparse working-set code owns the rule that a
// page is not written while another thread reads it (e.g. a prefetch copy). A page id stays valid
// for as long as some holder keeps a reference, so readers must hold one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/backend/backend_types.h"
#include "engine/common/buffer.h"
#include "engine/common/ceil_div.h"
#include "engine/common/dtype.h"

namespace specula {

using PageId = int32_t;
inline constexpr PageId kNoPage = -1;  // a page-table entry not allocated yet

class HostKvStore;

struct HostKvStoreOptions {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t page_size = 16;
  // Token positions the store can hold per (layer, KV head), summed over all sequences.
  int64_t capacity_tokens = 0;
  DType dtype = DType::kF32;  // of K and V
};

// One request's pages: for every (layer, KV head), page i holds positions
// [i * page_size, (i + 1) * page_size). Move-only so a page list cannot be released twice by
// accident; a moved-from or released sequence is empty. Release is explicit, not in a
// destructor, so the owner decides when pages return (e.g. after in-flight copies finish);
// move-assigning over a sequence that still holds pages is a CHECK failure (it would leak them).
class HostKvSequence {
 public:
  HostKvSequence() = default;
  HostKvSequence(HostKvSequence&& other) noexcept;
  HostKvSequence& operator=(HostKvSequence&& other) noexcept;
  HostKvSequence(const HostKvSequence&) = delete;
  HostKvSequence& operator=(const HostKvSequence&) = delete;

  bool empty() const { return store_ == nullptr; }
  // Token positions the sequence may ever hold: its page table's length, in tokens.
  int64_t capacity_tokens() const { return capacity_tokens_; }
  int32_t pages_per_head() const { return pages_per_head_; }
  // Pages per head that are allocated: [0, this) hold pages, the rest of the table kNoPage
  // until HostKvStore::Grow (a sparse request's pages come as it decodes).
  int32_t allocated_pages_per_head() const { return allocated_pages_; }
  int64_t allocated_tokens() const;
  // The page table of (layer, head), in position order (kNoPage past the allocated pages).
  absl::Span<const PageId> pages(int32_t layer, int32_t head) const;
  PageId page(int32_t layer, int32_t head, int32_t index) const;  // an allocated one
  // Appends page `index` of every (layer, KV head), layer-major: one block in the block-major
  // order the prefix cache keeps pages in (ReserveWithSharedPages takes them back).
  void AppendBlockPages(int32_t index, std::vector<PageId>* out) const;

 private:
  friend class HostKvStore;
  void Clear();

  const HostKvStore* store_ = nullptr;  // the owner; catches release into the wrong store
  int32_t num_layers_ = 0;
  int32_t num_kv_heads_ = 0;
  int32_t pages_per_head_ = 0;
  int64_t capacity_tokens_ = 0;
  int32_t allocated_pages_ = 0;
  std::vector<PageId> pages_;  // [layer][head][index]
};

class HostKvStore {
 public:
  // INVALID_ARGUMENT for non-positive sizes or a capacity beyond PageId's range;
  // RESOURCE_EXHAUSTED (naming the bytes) when the memory cannot be allocated.
  // The page pool comes from `allocate` (a backend's pinned host memory, so copies to and from
  // the device can be asynchronous); by default lazily committed anonymous memory.
  using Allocator = std::function<absl::StatusOr<DeviceBuffer>(size_t bytes)>;
  static absl::StatusOr<std::unique_ptr<HostKvStore>> Create(
      const HostKvStoreOptions& options, const Allocator& allocate = MapHostMemory);
  ~HostKvStore();
  HostKvStore(const HostKvStore&) = delete;
  HostKvStore& operator=(const HostKvStore&) = delete;

  // ceil(tokens / page_size) pages for every layer and KV head, all or nothing.
  // RESOURCE_EXHAUSTED (needed vs free pages and tokens) when they do not fit; INVALID_ARGUMENT
  // for negative `tokens`.
  absl::StatusOr<HostKvSequence> Reserve(int64_t tokens);
  // Like Reserve, but the first `prefix_pages` pages of every (layer, head) are `prefix`'s pages,
  // shared (each gains a reference), and only the rest are allocated. Shared pages must not be
  // written again by either holder. INVALID_ARGUMENT when `prefix` has fewer than `prefix_pages`
  // pages per head or `tokens` needs fewer pages than `prefix_pages`.
  absl::StatusOr<HostKvSequence> ReserveWithPrefix(const HostKvSequence& prefix,
                                                   int64_t prefix_pages, int64_t tokens);
  // Like ReserveWithPrefix, with the shared pages given block-major as the prefix cache keeps
  // them: `shared`[i * layers * kv_heads + layer * kv_heads + head] is page i of (layer, head).
  // Its size must be whole blocks (CHECKed).
  // With `allocate_tokens` >= 0, the table holds `tokens` but only the pages of the first
  // `allocate_tokens` (at least the shared ones) are allocated now; Grow adds the others.
  absl::StatusOr<HostKvSequence> ReserveWithSharedPages(absl::Span<const PageId> shared,
                                                        int64_t tokens,
                                                        int64_t allocate_tokens = -1);
  // Allocates the sequence's pages up to `tokens` (capped at its table), all or nothing:
  // RESOURCE_EXHAUSTED when they are not free. Pages already allocated stay.
  absl::Status Grow(HostKvSequence& sequence, int64_t tokens);
  // Drops the sequence's reference to each of its pages (freeing those that reach zero) and
  // empties it. Releasing an empty sequence is a no-op.
  void Release(HostKvSequence& sequence);

  // Per-page references for holders other than sequences. The page must be held already;
  // releasing a page more often than it was referenced is a CHECK failure.
  void Retain(PageId page);
  void ReleasePage(PageId page);
  int32_t refcount(PageId page) const;

  // The page's bytes: K [page_size][head_dim] then V, of dtype().
  void* Page(PageId page) { return PageBase(page); }
  const void* Page(PageId page) const { return PageBase(page); }
  // Typed views of an fp32 store (tests and tools); CHECK-fails on any other dtype.
  float* K(PageId page) { return F32Page(page); }
  const float* K(PageId page) const { return F32Page(page); }
  float* V(PageId page) { return F32Page(page) + page_elems() / 2; }
  const float* V(PageId page) const { return F32Page(page) + page_elems() / 2; }
  // The first `tokens` keys of `page` converted to fp32: out [tokens][head_dim].
  void ReadKeys(PageId page, int32_t tokens, float* out) const;

  // Stores one token's K and V rows (head_dim fp32 values each, converted to dtype()) of
  // (layer, head) at position `pos` into the sequence's page. CHECKs that
  // pos < sequence.capacity_tokens().
  void WriteToken(const HostKvSequence& sequence, int32_t layer, int32_t head, int64_t pos,
                  const float* k, const float* v);

  const HostKvStoreOptions& options() const { return options_; }
  int32_t num_layers() const { return options_.num_layers; }
  int32_t num_kv_heads() const { return options_.num_kv_heads; }
  int32_t head_dim() const { return options_.head_dim; }
  int32_t page_size() const { return options_.page_size; }
  // Pages per (layer, head) for `tokens` positions.
  int64_t PagesFor(int64_t tokens) const { return CeilDiv(tokens, options_.page_size); }
  int32_t pages_per_head_capacity() const { return pages_per_head_capacity_; }
  int32_t capacity_pages() const { return capacity_pages_; }
  int32_t used_pages() const;
  int32_t free_pages() const { return capacity_pages() - used_pages(); }
  DType dtype() const { return options_.dtype; }
  // Elements (K and V) and bytes of one page.
  size_t page_elems() const { return 2 * static_cast<size_t>(page_size()) * head_dim(); }
  size_t page_bytes() const { return page_elems() * DTypeSize(dtype()); }
  // Host bytes one token position takes over every layer and KV head.
  size_t bytes_per_token() const {
    return page_bytes() / page_size() * static_cast<size_t>(num_layers()) * num_kv_heads();
  }

  // The one allocation holding every page (page p at p * page_bytes()), so a device backend can
  // register it for direct transfers.
  void* data() const { return memory_.data(); }
  size_t bytes() const { return static_cast<size_t>(capacity_pages_) * page_bytes(); }
  // The pages as a pool device operations read and write (pinned host memory on a GPU).
  PagePoolView pool() const {
    return PagePoolView{memory_.data(), dtype(), page_size(), head_dim()};
  }

 private:
  HostKvStore() = default;
  char* PageBase(PageId page) const;
  float* F32Page(PageId page) const;
  // Takes `n` free pages; the caller holds mu_ and has checked that n fit.
  void TakePagesLocked(int64_t n, PageId* out);
  absl::StatusOr<HostKvSequence> ReserveShared(
      int64_t prefix_pages, int64_t tokens, int64_t allocate_tokens,
      absl::FunctionRef<PageId(int64_t lh, int64_t index)> shared_page);
  void DropReferenceLocked(PageId page);
  absl::Status NotEnoughPagesLocked(int64_t tokens, int64_t needed_pages) const;

  HostKvStoreOptions options_;
  int32_t pages_per_head_capacity_ = 0;
  int32_t capacity_pages_ = 0;
  DeviceBuffer memory_;  // the page pool, from the allocator

  mutable std::mutex mu_;
  std::vector<PageId> free_;       // stack of free page ids; guarded by mu_
  std::vector<int32_t> refcount_;  // per page, 0 when free; guarded by mu_
};

}  // namespace specula
