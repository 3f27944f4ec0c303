#include "engine/kv/kv_pool.h"

#include "engine/common/check.h"
#include "engine/common/status_macros.h"
#include "absl/strings/str_format.h"

namespace specula {

absl::StatusOr<KvPool> KvPool::Create(Backend& backend, const KvPoolOptions& options) {
  if (options.num_layers <= 0 || options.num_kv_heads <= 0 || options.head_dim <= 0 ||
      options.page_size <= 0 || options.num_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "kv pool: layers, kv heads, head_dim, page_size and blocks must be positive "
        "(got %d, %d, %d, %d, %d)",
        options.num_layers, options.num_kv_heads, options.head_dim, options.page_size,
        options.num_blocks));
  }
  KvPool pool;
  pool.options_ = options;
  auto memory = backend.Allocate(pool.bytes_per_block() * options.num_blocks);
  if (!memory.ok()) return memory.status();
  pool.memory_ = std::move(*memory);
  pool.free_.reserve(options.num_blocks);
  // Hand out low ids first: nicer to read in logs and tests.
  for (int32_t b = options.num_blocks - 1; b >= 0; --b) pool.free_.push_back(b);
  pool.refs_.assign(options.num_blocks, 0);
  return pool;
}

size_t KvPool::bytes_per_block() const {
  return static_cast<size_t>(options_.num_layers) * options_.num_kv_heads * 2 * options_.page_size *
         options_.head_dim * DTypeSize(options_.dtype);
}

absl::StatusOr<std::vector<int32_t>> KvPool::Allocate(int32_t n) {
  std::vector<int32_t> out;
  RETURN_IF_ERROR(AllocateInto(n, &out));
  return out;
}

absl::Status KvPool::AllocateInto(int32_t n, std::vector<int32_t>* blocks) {
  CHECK_GE(n, 0);
  if (n > free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "KV cache full: %d blocks of %d tokens requested, %d of %d free", n, options_.page_size,
        free_blocks(), num_blocks()));
  }
  if (n > 0 && reuse_guard_) reuse_guard_();
  for (auto it = free_.end() - n; it != free_.end(); ++it) refs_[*it] = 1;
  blocks->insert(blocks->end(), free_.end() - n, free_.end());
  free_.resize(free_.size() - n);
  return absl::OkStatus();
}

void KvPool::Retain(absl::Span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    CHECK(b >= 0 && b < num_blocks() && refs_[b] > 0) << "kv pool: retaining free block " << b;
    ++refs_[b];
  }
}

void KvPool::Free(absl::Span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    CHECK(b >= 0 && b < num_blocks() && refs_[b] > 0) << "kv pool: bad free of block " << b;
    if (--refs_[b] == 0) free_.push_back(b);
  }
}

void KvPool::CopyBlock(Stream& stream, int32_t src, int32_t dst) const {
  CHECK(src >= 0 && src < num_blocks() && dst >= 0 && dst < num_blocks() && src != dst);
  const size_t block_layer_bytes = bytes_per_block() / options_.num_layers;
  std::vector<PageCopy> copies;
  copies.reserve(options_.num_layers);
  for (int32_t layer = 0; layer < options_.num_layers; ++layer) {
    char* base = static_cast<char*>(Layer(layer).base);
    copies.push_back({base + block_layer_bytes * dst, base + block_layer_bytes * src});
  }
  stream.CopyPages(copies, block_layer_bytes);
}

std::vector<PageCopy> KvPool::HostCopies(absl::Span<const int32_t> blocks,
                                         const PagePoolView& host,
                                         absl::Span<const int32_t> host_pages,
                                         bool to_host) const {
  const int32_t layers = options_.num_layers;
  const int32_t heads = options_.num_kv_heads;
  CHECK_EQ(host_pages.size(), blocks.size() * layers * heads);
  CHECK(host.dtype == options_.dtype && host.page_size == options_.page_size &&
        host.head_dim == options_.head_dim);
  std::vector<PageCopy> copies;
  copies.reserve(host_pages.size());
  for (int32_t layer = 0; layer < layers; ++layer) {
    const PagePoolView pages = PagesOf(Layer(layer));
    for (size_t i = 0; i < blocks.size(); ++i) {
      CHECK(blocks[i] >= 0 && blocks[i] < num_blocks());
      for (int32_t h = 0; h < heads; ++h) {
        void* device = pages.page(static_cast<int64_t>(blocks[i]) * heads + h);
        void* page = host.page(host_pages[(i * layers + layer) * heads + h]);
        copies.push_back(to_host ? PageCopy{page, device} : PageCopy{device, page});
      }
    }
  }
  return copies;
}

void KvPool::CopyToHost(Stream& stream, absl::Span<const int32_t> blocks, const PagePoolView& host,
                        absl::Span<const int32_t> host_pages) const {
  if (blocks.empty()) return;
  stream.CopyPages(HostCopies(blocks, host, host_pages, /*to_host=*/true), host.page_bytes());
}

void KvPool::CopyFromHost(Stream& stream, const PagePoolView& host,
                          absl::Span<const int32_t> host_pages,
                          absl::Span<const int32_t> blocks) const {
  if (blocks.empty()) return;
  stream.CopyPages(HostCopies(blocks, host, host_pages, /*to_host=*/false), host.page_bytes());
}

HostKvStoreOptions KvPool::HostStoreOptions(int64_t capacity_tokens) const {
  HostKvStoreOptions host;
  host.num_layers = options_.num_layers;
  host.num_kv_heads = options_.num_kv_heads;
  host.head_dim = options_.head_dim;
  host.page_size = options_.page_size;
  host.capacity_tokens = capacity_tokens;
  host.dtype = options_.dtype;
  return host;
}

KvLayerView KvPool::Layer(int32_t layer) const {
  KvLayerView v;
  v.dtype = options_.dtype;
  v.num_kv_heads = options_.num_kv_heads;
  v.page_size = options_.page_size;
  v.head_dim = options_.head_dim;
  // Layers are contiguous regions of num_blocks blocks each.
  const size_t layer_bytes = bytes_per_block() / options_.num_layers * options_.num_blocks;
  v.base = static_cast<char*>(memory_.data()) + layer_bytes * layer;
  return v;
}

}  // namespace specula
