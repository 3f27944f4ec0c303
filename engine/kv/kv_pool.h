// The device-resident pool of KV pages for dense attention. Memory is carved into blocks; a block
// holds `page_size` token positions of every layer and KV head (one page per layer and head), so
// a sequence's KV is described by one block table that serves every layer.
//
// Owned by the engine thread; not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/backend/backend.h"
#include "engine/common/ceil_div.h"
#include "engine/kv/host_kv_store.h"

namespace specula {

struct KvPoolOptions {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t page_size = 16;
  int32_t num_blocks = 0;
  DType dtype = DType::kF32;  // of K and V (kv_cache.dtype)
};

class KvPool {
 public:
  static absl::StatusOr<KvPool> Create(Backend& backend, const KvPoolOptions& options);
  KvPool() = default;  // empty: no blocks until assigned from Create

  // RESOURCE_EXHAUSTED when fewer than `n` blocks are free (nothing is taken then).
  absl::StatusOr<std::vector<int32_t>> Allocate(int32_t n);
  // The same, appended to `blocks` (a sequence's own list: no vector of its own).
  absl::Status AllocateInto(int32_t n, std::vector<int32_t>* blocks);
  // Blocks are refcounted so finished sequences' blocks can stay in the prefix cache while new
  // sequences share them: Allocate gives each block one reference, Retain adds one, Free drops
  // one and returns the block at zero. Every block must be held (CHECKed).
  void Retain(absl::Span<const int32_t> blocks);
  void Free(absl::Span<const int32_t> blocks);
  int32_t refcount(int32_t block) const { return refs_[block]; }
  // Runs in Allocate before blocks are handed out: blocks freed while copies on another stream
  // may still write them (a released sparse working set's slots) become safe to reuse there
  // (SparseKvCache waits for those copies, if they have not landed yet).
  void set_reuse_guard(std::function<void()> guard) { reuse_guard_ = std::move(guard); }

  KvLayerView Layer(int32_t layer) const;
  // Enqueues a copy of block `src`'s pages (every layer and KV head) into block `dst` on
  // `stream` (copy-on-write of a cached, partly reused block).
  void CopyBlock(Stream& stream, int32_t src, int32_t dst) const;
  // Offload and reload (docs/SESSIONS.md): one batched copy on `stream` between blocks and
  // pages of the host store `host`, which has the pool's page layout. `host_pages` is
  // block-major, as the prefix cache keeps them: the page of (blocks[i], layer, head) is
  // host_pages[(i * num_layers + layer) * num_kv_heads + head].
  void CopyToHost(Stream& stream, absl::Span<const int32_t> blocks, const PagePoolView& host,
                  absl::Span<const int32_t> host_pages) const;
  void CopyFromHost(Stream& stream, const PagePoolView& host, absl::Span<const int32_t> host_pages,
                    absl::Span<const int32_t> blocks) const;
  const KvPoolOptions& options() const { return options_; }
  // A host store whose pages are this pool's (layers, KV heads, head_dim, page size, dtype), so
  // pages move between them as bytes; `capacity_tokens` per layer and KV head.
  HostKvStoreOptions HostStoreOptions(int64_t capacity_tokens) const;
  int32_t page_size() const { return options_.page_size; }
  DType dtype() const { return options_.dtype; }
  int32_t num_blocks() const { return options_.num_blocks; }
  int32_t free_blocks() const { return static_cast<int32_t>(free_.size()); }
  int32_t used_blocks() const { return num_blocks() - free_blocks(); }
  // Blocks needed for `tokens` positions.
  int32_t BlocksFor(int64_t tokens) const {
    return static_cast<int32_t>(CeilDiv(tokens, options_.page_size));
  }
  size_t bytes_per_block() const;

 private:
  // The (block page, host page) pairs of CopyToHost/CopyFromHost, as (device, host) pointers.
  std::vector<PageCopy> HostCopies(absl::Span<const int32_t> blocks, const PagePoolView& host,
                                   absl::Span<const int32_t> host_pages, bool to_host) const;

  KvPoolOptions options_;
  DeviceBuffer memory_;
  std::vector<int32_t> free_;  // stack of free block ids
  std::vector<int32_t> refs_;  // per block, 0 when free (catches double frees)
  std::function<void()> reuse_guard_;
};

}  // namespace specula
