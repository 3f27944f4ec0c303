#include "engine/kv/host_kv_store.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_format.h"
#include "engine/common/ceil_div.h"
#include "engine/common/check.h"
#include "engine/common/fault_injection.h"

namespace specula {

HostKvSequence::HostKvSequence(HostKvSequence&& other) noexcept { *this = std::move(other); }

HostKvSequence& HostKvSequence::operator=(HostKvSequence&& other) noexcept {
  if (this != &other) {
    // Overwriting a live sequence would leak its pages.
    CHECK(empty()) << "host kv: move-assigning over a sequence that still holds pages";
    store_ = other.store_;
    num_layers_ = other.num_layers_;
    num_kv_heads_ = other.num_kv_heads_;
    pages_per_head_ = other.pages_per_head_;
    capacity_tokens_ = other.capacity_tokens_;
    allocated_pages_ = other.allocated_pages_;
    pages_ = std::move(other.pages_);
    other.Clear();
  }
  return *this;
}

void HostKvSequence::Clear() {
  store_ = nullptr;
  num_layers_ = 0;
  num_kv_heads_ = 0;
  pages_per_head_ = 0;
  capacity_tokens_ = 0;
  allocated_pages_ = 0;
  pages_.clear();
}

int64_t HostKvSequence::allocated_tokens() const {
  return store_ == nullptr
             ? 0
             : std::min<int64_t>(capacity_tokens_,
                                 static_cast<int64_t>(allocated_pages_) * store_->page_size());
}

absl::Span<const PageId> HostKvSequence::pages(int32_t layer, int32_t head) const {
  CHECK(layer >= 0 && layer < num_layers_ && head >= 0 && head < num_kv_heads_)
      << "layer " << layer << " head " << head;
  const size_t begin = (static_cast<size_t>(layer) * num_kv_heads_ + head) * pages_per_head_;
  return absl::MakeConstSpan(pages_.data() + begin, pages_per_head_);
}

PageId HostKvSequence::page(int32_t layer, int32_t head, int32_t index) const {
  CHECK(index >= 0 && index < allocated_pages_) << "page index " << index << " of "
                                                << allocated_pages_ << " allocated";
  return pages(layer, head)[index];
}

void HostKvSequence::AppendBlockPages(int32_t index, std::vector<PageId>* out) const {
  for (int32_t layer = 0; layer < num_layers_; ++layer) {
    for (int32_t head = 0; head < num_kv_heads_; ++head) out->push_back(page(layer, head, index));
  }
}

absl::StatusOr<std::unique_ptr<HostKvStore>> HostKvStore::Create(const HostKvStoreOptions& options,
                                                                 const Allocator& allocate) {
  if (options.num_layers <= 0 || options.num_kv_heads <= 0 || options.head_dim <= 0 ||
      options.page_size <= 0 || options.capacity_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "host kv store: layers, kv heads, head_dim, page_size and capacity_tokens must be "
        "positive (got %d, %d, %d, %d, %d)",
        options.num_layers, options.num_kv_heads, options.head_dim, options.page_size,
        options.capacity_tokens));
  }
  const int64_t per_head = CeilDiv(options.capacity_tokens, options.page_size);
  // 128-bit so absurd configurations are reported instead of wrapping around.
  const unsigned __int128 pages =
      static_cast<unsigned __int128>(per_head) * options.num_layers * options.num_kv_heads;
  if (pages > static_cast<unsigned __int128>(std::numeric_limits<PageId>::max())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "host kv store: %d tokens x %d layers x %d kv heads needs more pages than a 32-bit "
        "page id can name; lower capacity_tokens or raise page_size",
        options.capacity_tokens, options.num_layers, options.num_kv_heads));
  }
  const unsigned __int128 bytes128 = pages * 2 * static_cast<unsigned __int128>(options.page_size) *
                                     options.head_dim * DTypeSize(options.dtype);
  if (bytes128 > std::numeric_limits<size_t>::max() / 2) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "host kv store: cannot allocate %.0f bytes (%d pages): beyond the address space",
        static_cast<double>(bytes128), static_cast<int64_t>(pages)));
  }

  std::unique_ptr<HostKvStore> store(new HostKvStore());
  store->options_ = options;
  store->pages_per_head_capacity_ = static_cast<int32_t>(per_head);
  store->capacity_pages_ = static_cast<int32_t>(pages);
  const size_t bytes = static_cast<size_t>(bytes128);
  auto memory = allocate(bytes);
  if (!memory.ok()) {
    return absl::ResourceExhaustedError(absl::StrFormat("host kv store: %d pages of %d bytes: %s",
                                                        store->capacity_pages_, store->page_bytes(),
                                                        memory.status().message()));
  }
  CHECK_GE(memory->bytes(), bytes) << "host kv store: the allocator returned too little";
  store->memory_ = std::move(*memory);
  store->refcount_.assign(store->capacity_pages_, 0);
  store->free_.reserve(store->capacity_pages_);
  // Hand out low ids first: nicer to read in logs and tests.
  for (PageId p = store->capacity_pages_ - 1; p >= 0; --p) store->free_.push_back(p);
  return store;
}

HostKvStore::~HostKvStore() = default;

char* HostKvStore::PageBase(PageId page) const {
  CHECK(page >= 0 && page < capacity_pages_) << "host kv: page " << page << " out of range";
  return static_cast<char*>(memory_.data()) + static_cast<size_t>(page) * page_bytes();
}

float* HostKvStore::F32Page(PageId page) const {
  CHECK(dtype() == DType::kF32) << "host kv: fp32 view of a " << DTypeName(dtype()) << " store";
  return reinterpret_cast<float*>(PageBase(page));
}

void HostKvStore::ReadKeys(PageId page, int32_t tokens, float* out) const {
  CHECK(tokens >= 0 && tokens <= page_size()) << "host kv: " << tokens << " keys";
  ConvertToF32(dtype(), PageBase(page), out, static_cast<size_t>(tokens) * head_dim());
}

int32_t HostKvStore::used_pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return capacity_pages_ - static_cast<int32_t>(free_.size());
}

absl::Status HostKvStore::NotEnoughPagesLocked(int64_t tokens, int64_t needed_pages) const {
  const int64_t heads = static_cast<int64_t>(num_layers()) * num_kv_heads();
  const int64_t free_pages = static_cast<int64_t>(free_.size());
  return absl::ResourceExhaustedError(absl::StrFormat(
      "host KV store full: %d tokens need %d new pages (%d per layer and KV head x %d), but "
      "only %d of %d pages are free (room for %d more tokens)",
      tokens, needed_pages, needed_pages / heads, heads, free_pages, capacity_pages_,
      free_pages / heads * page_size()));
}

void HostKvStore::TakePagesLocked(int64_t n, PageId* out) {
  for (int64_t i = 0; i < n; ++i) {
    const PageId p = free_.back();
    free_.pop_back();
    refcount_[p] = 1;
    out[i] = p;
  }
}

absl::StatusOr<HostKvSequence> HostKvStore::Reserve(int64_t tokens) {
  HostKvSequence empty;
  return ReserveWithPrefix(empty, 0, tokens);
}

absl::StatusOr<HostKvSequence> HostKvStore::ReserveWithPrefix(const HostKvSequence& prefix,
                                                              int64_t prefix_pages,
                                                              int64_t tokens) {
  CHECK(prefix.empty() || prefix.store_ == this) << "host kv: prefix from another store";
  if (prefix_pages < 0 || prefix_pages > prefix.allocated_pages_per_head()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("host kv: cannot share %d prefix pages of a sequence with %d allocated "
                        "per head",
                        prefix_pages, prefix.allocated_pages_per_head()));
  }
  return ReserveShared(prefix_pages, tokens, tokens, [&](int64_t lh, int64_t i) {
    return prefix.pages_[lh * prefix.pages_per_head() + i];
  });
}

absl::StatusOr<HostKvSequence> HostKvStore::ReserveWithSharedPages(absl::Span<const PageId> shared,
                                                                   int64_t tokens,
                                                                   int64_t allocate_tokens) {
  const int64_t heads = static_cast<int64_t>(num_layers()) * num_kv_heads();
  CHECK_EQ(static_cast<int64_t>(shared.size()) % heads, 0)
      << "host kv: shared pages are not whole blocks of every layer and KV head";
  return ReserveShared(static_cast<int64_t>(shared.size()) / heads, tokens,
                       allocate_tokens < 0 ? tokens : std::min(allocate_tokens, tokens),
                       [&](int64_t lh, int64_t i) { return shared[i * heads + lh]; });
}

absl::StatusOr<HostKvSequence> HostKvStore::ReserveShared(
    int64_t prefix_pages, int64_t tokens, int64_t allocate_tokens,
    absl::FunctionRef<PageId(int64_t lh, int64_t index)> shared_page) {
  if (tokens < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("host kv: negative token count %d", tokens));
  }
  const int64_t per_head = PagesFor(tokens);
  if (per_head < prefix_pages) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "host kv: %d tokens fill %d pages per head, fewer than the %d shared prefix pages", tokens,
        per_head, prefix_pages));
  }
  if (SPECULA_FAULT(Fault::kHostPageAlloc)) {
    return absl::InternalError("host kv: page allocation failed (injected fault)");
  }
  const int64_t heads = static_cast<int64_t>(num_layers()) * num_kv_heads();
  const int64_t allocated = std::max(prefix_pages, std::min(per_head, PagesFor(allocate_tokens)));
  const int64_t new_per_head = allocated - prefix_pages;
  const int64_t needed = new_per_head * heads;

  HostKvSequence seq;
  std::lock_guard<std::mutex> lock(mu_);
  // Checked before any page is taken: all or nothing. `needed` fits in free_ implies every
  // count below fits in 32 bits.
  if (needed > static_cast<int64_t>(free_.size())) return NotEnoughPagesLocked(tokens, needed);
  seq.store_ = this;
  seq.num_layers_ = num_layers();
  seq.num_kv_heads_ = num_kv_heads();
  seq.pages_per_head_ = static_cast<int32_t>(per_head);
  seq.capacity_tokens_ = tokens;
  seq.allocated_pages_ = static_cast<int32_t>(allocated);
  seq.pages_.assign(static_cast<size_t>(per_head * heads), kNoPage);
  for (int64_t lh = 0; lh < heads; ++lh) {
    PageId* out = seq.pages_.data() + lh * per_head;
    for (int64_t i = 0; i < prefix_pages; ++i) {
      const PageId p = shared_page(lh, i);
      CHECK(p >= 0 && p < capacity_pages_) << "host kv: page " << p << " out of range";
      CHECK_GT(refcount_[p], 0) << "host kv: prefix page " << p << " is free";
      ++refcount_[p];
      out[i] = p;
    }
    TakePagesLocked(new_per_head, out + prefix_pages);
  }
  return seq;
}

absl::Status HostKvStore::Grow(HostKvSequence& sequence, int64_t tokens) {
  CHECK(!sequence.empty() && sequence.store_ == this) << "host kv: growing a foreign sequence";
  const int64_t target = std::min<int64_t>(PagesFor(tokens), sequence.pages_per_head_);
  const int64_t from = sequence.allocated_pages_;
  if (target <= from) return absl::OkStatus();
  if (SPECULA_FAULT(Fault::kHostPageAlloc)) {
    return absl::InternalError("host kv: page allocation failed (injected fault)");
  }
  const int64_t heads = static_cast<int64_t>(num_layers()) * num_kv_heads();
  const int64_t needed = (target - from) * heads;
  std::lock_guard<std::mutex> lock(mu_);
  if (needed > static_cast<int64_t>(free_.size())) return NotEnoughPagesLocked(tokens, needed);
  for (int64_t lh = 0; lh < heads; ++lh) {
    TakePagesLocked(target - from, sequence.pages_.data() + lh * sequence.pages_per_head_ + from);
  }
  sequence.allocated_pages_ = static_cast<int32_t>(target);
  return absl::OkStatus();
}

void HostKvStore::DropReferenceLocked(PageId page) {
  CHECK(page >= 0 && page < capacity_pages_) << "host kv: page " << page << " out of range";
  CHECK_GT(refcount_[page], 0) << "host kv: page " << page << " released more than held";
  if (--refcount_[page] == 0) free_.push_back(page);
}

void HostKvStore::Release(HostKvSequence& sequence) {
  if (sequence.empty()) return;
  CHECK(sequence.store_ == this) << "host kv: releasing a sequence into another store";
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (PageId p : sequence.pages_) {
      if (p != kNoPage) DropReferenceLocked(p);
    }
  }
  sequence.Clear();
}

void HostKvStore::Retain(PageId page) {
  std::lock_guard<std::mutex> lock(mu_);
  CHECK(page >= 0 && page < capacity_pages_) << "host kv: page " << page << " out of range";
  CHECK_GT(refcount_[page], 0) << "host kv: retaining free page " << page;
  ++refcount_[page];
}

void HostKvStore::ReleasePage(PageId page) {
  std::lock_guard<std::mutex> lock(mu_);
  DropReferenceLocked(page);
}

int32_t HostKvStore::refcount(PageId page) const {
  std::lock_guard<std::mutex> lock(mu_);
  CHECK(page >= 0 && page < capacity_pages_) << "host kv: page " << page << " out of range";
  return refcount_[page];
}

void HostKvStore::WriteToken(const HostKvSequence& sequence, int32_t layer, int32_t head,
                             int64_t pos, const float* k, const float* v) {
  CHECK(sequence.store_ == this) << "host kv: writing through a sequence of another store";
  CHECK(pos >= 0 && pos < sequence.allocated_tokens())
      << "host kv: position " << pos << " outside the allocated " << sequence.allocated_tokens();
  const PageId page = sequence.page(layer, head, static_cast<int32_t>(pos / page_size()));
  const size_t elem = DTypeSize(dtype());
  const size_t offset = static_cast<size_t>(pos % page_size()) * head_dim() * elem;
  char* base = PageBase(page);
  ConvertFromF32(dtype(), k, base + offset, head_dim());
  ConvertFromF32(dtype(), v, base + page_bytes() / 2 + offset, head_dim());
}

}  // namespace specula
