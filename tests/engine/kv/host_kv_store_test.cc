#include "engine/kv/host_kv_store.h"

#include <atomic>
#include <cstdint>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

// 3 layers x 2 KV heads, 16-token pages, 100 tokens => 7 pages per (layer, head), 42 pages.
HostKvStoreOptions SmallOptions() {
  HostKvStoreOptions o;
  o.num_layers = 3;
  o.num_kv_heads = 2;
  o.head_dim = 8;
  o.page_size = 16;
  o.capacity_tokens = 100;
  return o;
}

std::unique_ptr<HostKvStore> MakeStore(const HostKvStoreOptions& options) {
  auto store = HostKvStore::Create(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return std::move(*store);
}

TEST(HostKvStoreTest, CapacityMath) {
  auto store = MakeStore(SmallOptions());
  EXPECT_EQ(store->pages_per_head_capacity(), 7);
  EXPECT_EQ(store->capacity_pages(), 42);
  EXPECT_EQ(store->page_elems(), 2u * 16 * 8);
  EXPECT_EQ(store->page_bytes(), 2u * 16 * 8 * sizeof(float));
  EXPECT_EQ(store->bytes(), 42 * store->page_bytes());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(store->data()) % 64, 0u);
  EXPECT_EQ(store->used_pages(), 0);
  EXPECT_EQ(store->free_pages(), 42);
  EXPECT_EQ(store->PagesFor(0), 0);
  EXPECT_EQ(store->PagesFor(16), 1);
  EXPECT_EQ(store->PagesFor(17), 2);
  // Pages tile the allocation: K then V, page after page.
  EXPECT_EQ(store->K(0), static_cast<float*>(store->data()));
  EXPECT_EQ(store->V(0), store->K(0) + 16 * 8);
  EXPECT_EQ(store->K(41), store->K(0) + 41 * store->page_elems());
}

// kv_cache.dtype bf16/f16: two bytes per value, so a page, the allocation and the bytes per
// token are half of fp32's; a written token is stored rounded to nearest even and read back
// (ReadKeys) as exactly that rounded value.
TEST(HostKvStoreTest, HalfPrecisionPagesStoreRoundedValuesInHalfTheBytes) {
  HostKvStoreOptions f32 = SmallOptions();
  auto wide = MakeStore(f32);
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    HostKvStoreOptions o = SmallOptions();
    o.dtype = dtype;
    auto store = MakeStore(o);
    EXPECT_EQ(store->dtype(), dtype);
    EXPECT_EQ(store->page_bytes() * 2, wide->page_bytes());
    EXPECT_EQ(store->bytes() * 2, wide->bytes());
    EXPECT_EQ(store->bytes_per_token() * 2, wide->bytes_per_token());
    EXPECT_EQ(wide->bytes_per_token(), 3u * 2 * 2 * 8 * sizeof(float));  // layers, heads, K+V

    auto seq = store->Reserve(20);
    ASSERT_TRUE(seq.ok());
    std::vector<float> k(8), v(8);
    for (int c = 0; c < 8; ++c) {
      k[c] = 1.0f + static_cast<float>(c + 1) / 9.0f;  // not representable in 16 bits
      v[c] = -k[c];
    }
    store->WriteToken(*seq, 1, 1, 17, k.data(), v.data());
    const PageId page = seq->page(1, 1, 1);
    std::vector<float> keys(2 * 8);
    store->ReadKeys(page, 2, keys.data());
    const auto* raw = static_cast<const uint16_t*>(store->Page(page));
    for (int c = 0; c < 8; ++c) {
      const uint16_t want_k = dtype == DType::kBF16 ? FloatToBf16(k[c]) : FloatToF16(k[c]);
      const uint16_t want_v = dtype == DType::kBF16 ? FloatToBf16(v[c]) : FloatToF16(v[c]);
      EXPECT_EQ(raw[8 + c], want_k) << c;           // K row of offset 1
      EXPECT_EQ(raw[16 * 8 + 8 + c], want_v) << c;  // V row of offset 1
      const float back = dtype == DType::kBF16 ? Bf16ToFloat(want_k) : F16ToFloat(want_k);
      EXPECT_EQ(keys[8 + c], back) << c;
      EXPECT_NE(keys[8 + c], k[c]) << c;  // really rounded, not stored in fp32
    }
    EXPECT_DEATH(store->K(page), "fp32 view");
    store->Release(*seq);
  }
}

TEST(HostKvStoreTest, RejectsBadOptions) {
  const std::vector<void (*)(HostKvStoreOptions&)> breakers = {
      [](HostKvStoreOptions& o) { o.num_layers = 0; },
      [](HostKvStoreOptions& o) { o.num_kv_heads = -1; },
      [](HostKvStoreOptions& o) { o.head_dim = 0; },
      [](HostKvStoreOptions& o) { o.page_size = 0; },
      [](HostKvStoreOptions& o) { o.capacity_tokens = 0; },
  };
  for (auto breaker : breakers) {
    HostKvStoreOptions o = SmallOptions();
    breaker(o);
    EXPECT_EQ(HostKvStore::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  }
  // More pages than a 32-bit id can name.
  HostKvStoreOptions o = SmallOptions();
  o.page_size = 1;
  o.capacity_tokens = int64_t{1} << 31;
  EXPECT_EQ(HostKvStore::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HostKvStoreTest, AllocationFailureIsResourceExhaustedNamingBytes) {
  // 1000 pages of 8 TiB each: far beyond any address space.
  HostKvStoreOptions o;
  o.num_layers = 1;
  o.num_kv_heads = 1;
  o.head_dim = 1 << 20;
  o.page_size = 1 << 20;
  o.capacity_tokens = int64_t{1000} << 20;
  auto store = HostKvStore::Create(o);
  ASSERT_EQ(store.status().code(), absl::StatusCode::kResourceExhausted) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr("8796093022208000 bytes"));
}

TEST(HostKvStoreTest, PagesLiveInTheMemoryTheAllocatorGives) {
  // The sparse cache passes the backend's pinned host memory: the store must use exactly it
  // (a device registers that range for asynchronous copies), and report its failure.
  std::vector<size_t> asked;
  std::vector<char> arena(1 << 20);
  auto allocate = [&](size_t bytes) -> absl::StatusOr<DeviceBuffer> {
    asked.push_back(bytes);
    if (bytes > arena.size()) return absl::ResourceExhaustedError("no pinned memory left");
    return DeviceBuffer(arena.data(), bytes, [](void*) {});
  };
  auto store = HostKvStore::Create(SmallOptions(), allocate);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ((*store)->data(), arena.data());
  EXPECT_EQ((*store)->bytes(), asked[0]);

  HostKvStoreOptions big = SmallOptions();
  big.capacity_tokens *= 1 << 12;
  auto failed = HostKvStore::Create(big, allocate);
  ASSERT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(failed.status().message(), HasSubstr("no pinned memory left"));
}

TEST(HostKvStoreTest, ReserveAndReleaseAccounting) {
  auto store = MakeStore(SmallOptions());
  auto seq = store->Reserve(33);  // 3 pages per (layer, head)
  ASSERT_TRUE(seq.ok()) << seq.status();
  EXPECT_FALSE(seq->empty());
  EXPECT_EQ(seq->capacity_tokens(), 33);
  EXPECT_EQ(seq->pages_per_head(), 3);
  EXPECT_EQ(store->used_pages(), 3 * 6);
  std::set<PageId> distinct;
  for (int l = 0; l < 3; ++l) {
    for (int h = 0; h < 2; ++h) {
      ASSERT_EQ(seq->pages(l, h).size(), 3u);
      for (PageId p : seq->pages(l, h)) {
        distinct.insert(p);
        EXPECT_EQ(store->refcount(p), 1);
      }
    }
  }
  EXPECT_EQ(distinct.size(), 18u);

  auto empty = store->Reserve(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->pages_per_head(), 0);
  EXPECT_EQ(store->used_pages(), 18);

  HostKvSequence moved = std::move(*seq);
  EXPECT_TRUE(seq->empty());
  store->Release(*seq);  // empty: no-op
  store->Release(moved);
  EXPECT_TRUE(moved.empty());
  store->Release(*empty);
  EXPECT_EQ(store->used_pages(), 0);
  for (PageId p : distinct) EXPECT_EQ(store->refcount(p), 0);

  EXPECT_EQ(store->Reserve(-1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(HostKvStoreTest, ExhaustionIsAllOrNothingWithMessage) {
  auto store = MakeStore(SmallOptions());
  auto a = store->Reserve(64);  // 4 pages x 6 = 24 pages
  ASSERT_TRUE(a.ok());
  auto b = store->Reserve(64);  // needs 24, 18 free
  ASSERT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(b.status().message(), HasSubstr("64 tokens need 24 new pages"));
  EXPECT_THAT(b.status().message(), HasSubstr("only 18 of 42 pages are free"));
  EXPECT_THAT(b.status().message(), HasSubstr("room for 48 more tokens"));
  EXPECT_EQ(store->used_pages(), 24);  // nothing taken by the failed call
  // More than the whole store fails the same way, without overflow.
  EXPECT_EQ(store->Reserve(int64_t{1} << 40).status().code(), absl::StatusCode::kResourceExhausted);
  auto c = store->Reserve(48);  // exactly what is left
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(store->free_pages(), 0);
  store->Release(*a);
  store->Release(*c);
  EXPECT_EQ(store->used_pages(), 0);
}

TEST(HostKvStoreTest, PrefixPagesAreSharedUntilTheLastHolderReleases) {
  auto store = MakeStore(SmallOptions());
  auto a = store->Reserve(40);  // 3 pages per head
  ASSERT_TRUE(a.ok());
  auto b = store->ReserveWithPrefix(*a, 2, 70);  // 5 per head: 2 shared + 3 new
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(store->used_pages(), 3 * 6 + 3 * 6);
  std::vector<PageId> shared, a_only, b_only;
  for (int l = 0; l < 3; ++l) {
    for (int h = 0; h < 2; ++h) {
      ASSERT_EQ(b->pages(l, h).size(), 5u);
      for (int i = 0; i < 2; ++i) {
        EXPECT_EQ(b->page(l, h, i), a->page(l, h, i));
        EXPECT_EQ(store->refcount(b->page(l, h, i)), 2);
        shared.push_back(b->page(l, h, i));
      }
      a_only.push_back(a->page(l, h, 2));
      for (int i = 2; i < 5; ++i) {
        EXPECT_NE(b->page(l, h, i), a->page(l, h, 2));
        b_only.push_back(b->page(l, h, i));
      }
    }
  }
  // The original holder goes first: shared pages stay alive for the sharer.
  store->Release(*a);
  EXPECT_EQ(store->used_pages(), 5 * 6);
  for (PageId p : shared) EXPECT_EQ(store->refcount(p), 1);
  for (PageId p : a_only) EXPECT_EQ(store->refcount(p), 0);
  // A third sequence shares b's first page while b still lives; then b goes.
  auto c = store->ReserveWithPrefix(*b, 1, 16);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(store->used_pages(), 5 * 6);  // nothing new
  store->Release(*b);
  EXPECT_EQ(store->used_pages(), 6);
  for (int l = 0; l < 3; ++l) {
    for (int h = 0; h < 2; ++h) EXPECT_EQ(store->refcount(c->page(l, h, 0)), 1);
  }
  store->Release(*c);
  EXPECT_EQ(store->used_pages(), 0);
  for (PageId p : b_only) EXPECT_EQ(store->refcount(p), 0);
}

TEST(HostKvStoreTest, PrefixArgumentsAreValidated) {
  auto store = MakeStore(SmallOptions());
  auto a = store->Reserve(32);  // 2 pages per head
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(store->ReserveWithPrefix(*a, 3, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->ReserveWithPrefix(*a, -1, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->ReserveWithPrefix(*a, 2, 16).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Shared pages do not count against free space: 5 free pages per head suffice for 7 total.
  auto b = store->ReserveWithPrefix(*a, 2, 100);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(store->free_pages(), 0);
  auto c = store->ReserveWithPrefix(*a, 2, 33);  // one new page per head, none free
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store->refcount(a->page(0, 0, 0)), 2);  // the failed call took no references
  store->Release(*b);
  store->Release(*a);
  EXPECT_EQ(store->used_pages(), 0);
}

TEST(HostKvStoreTest, RetainKeepsAPageAfterItsSequenceIsReleased) {
  auto store = MakeStore(SmallOptions());
  auto a = store->Reserve(16);
  ASSERT_TRUE(a.ok());
  const PageId p = a->page(1, 1, 0);
  store->Retain(p);
  EXPECT_EQ(store->refcount(p), 2);
  store->Release(*a);
  EXPECT_EQ(store->used_pages(), 1);
  EXPECT_EQ(store->refcount(p), 1);
  store->ReleasePage(p);
  EXPECT_EQ(store->used_pages(), 0);
}

// A sparse request's pages come as it decodes: the table is sized for its whole length, the
// pages only for what is allocated, and Grow adds them all or nothing.
TEST(HostKvStoreTest, PagesAreAllocatedAsTheSequenceGrows) {
  auto store = MakeStore(SmallOptions());  // 7 pages per head, 6 heads
  auto a = store->ReserveWithSharedPages({}, /*tokens=*/100, /*allocate_tokens=*/20);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->pages_per_head(), 7);
  EXPECT_EQ(a->allocated_pages_per_head(), 2);
  EXPECT_EQ(a->allocated_tokens(), 32);
  EXPECT_EQ(store->used_pages(), 2 * 6);
  EXPECT_EQ(a->pages(1, 1)[2], kNoPage);
  ASSERT_TRUE(store->Grow(*a, 33).ok());  // a third page per head
  EXPECT_EQ(a->allocated_pages_per_head(), 3);
  EXPECT_NE(a->pages(1, 1)[2], kNoPage);
  EXPECT_EQ(store->used_pages(), 3 * 6);
  ASSERT_TRUE(store->Grow(*a, 20).ok());  // never shrinks
  EXPECT_EQ(a->allocated_pages_per_head(), 3);
  // Another sequence takes 3 pages per head: a can grow by one page only, not by two.
  auto b = store->Reserve(48);
  ASSERT_TRUE(b.ok());
  const absl::Status full = store->Grow(*a, 100);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_EQ(a->allocated_pages_per_head(), 3) << "all or nothing";
  EXPECT_EQ(store->used_pages(), 6 * 6);
  ASSERT_TRUE(store->Grow(*a, 64).ok());
  EXPECT_EQ(store->free_pages(), 0);
  store->Release(*a);  // unallocated entries are not released
  store->Release(*b);
  EXPECT_EQ(store->used_pages(), 0);
}

TEST(HostKvStoreDeathTest, ProgrammerErrorsCheckFail) {
  auto store = MakeStore(SmallOptions());
  auto a = store->Reserve(20);
  ASSERT_TRUE(a.ok());
  const PageId p = a->page(0, 0, 0);
  std::vector<float> row(8, 1.0f);
  EXPECT_DEATH(store->WriteToken(*a, 0, 0, 20, row.data(), row.data()), "outside the allocated");
  EXPECT_DEATH(store->WriteToken(*a, 3, 0, 0, row.data(), row.data()), "layer 3");
  EXPECT_DEATH(store->Retain(store->capacity_pages() - 1), "retaining free page");
  store->Release(*a);
  EXPECT_DEATH(store->ReleasePage(p), "released more than held");
}

TEST(HostKvStoreTest, WriteTokenLandsAtPageAndOffset) {
  auto store = MakeStore(SmallOptions());
  auto a = store->Reserve(16);  // occupies low ids so b's pages are not 0..n
  auto b = store->Reserve(45);
  ASSERT_TRUE(a.ok() && b.ok());
  auto value = [](int l, int h, int pos, int c, bool v) {
    return (v ? -1.0f : 1.0f) * static_cast<float>(l * 100000 + h * 10000 + pos * 10 + c);
  };
  std::vector<float> k(8), v(8);
  for (int l = 0; l < 3; ++l) {
    for (int h = 0; h < 2; ++h) {
      for (int pos : {0, 1, 15, 16, 17, 31, 32, 44}) {
        for (int c = 0; c < 8; ++c) {
          k[c] = value(l, h, pos, c, false);
          v[c] = value(l, h, pos, c, true);
        }
        store->WriteToken(*b, l, h, pos, k.data(), v.data());
      }
    }
  }
  for (int l = 0; l < 3; ++l) {
    for (int h = 0; h < 2; ++h) {
      for (int pos : {0, 1, 15, 16, 17, 31, 32, 44}) {
        const PageId page = b->page(l, h, pos / 16);
        for (int c = 0; c < 8; ++c) {
          ASSERT_EQ(store->K(page)[(pos % 16) * 8 + c], value(l, h, pos, c, false));
          ASSERT_EQ(store->V(page)[(pos % 16) * 8 + c], value(l, h, pos, c, true));
        }
      }
    }
  }
  store->Release(*a);
  store->Release(*b);
}

// Eight threads reserve, share, stamp and release at random. Each stamps its own new pages and
// checks the stamps before releasing, so two live sequences given the same page would show up;
// the accounting must return exactly to zero.
TEST(HostKvStoreTest, ConcurrentReserveReleaseKeepsAccountingExact) {
  HostKvStoreOptions o = SmallOptions();
  o.num_layers = 2;
  o.page_size = 4;
  // 30 pages per (layer, head), 120 pages: a single thread holding a few sequences fills it.
  o.capacity_tokens = 120;
  auto store = MakeStore(o);
  constexpr int kThreads = 8;
  std::atomic<int> failures{0};
  std::atomic<int> successes{0};
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Start together so the threads really interleave on a small machine.
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();
      std::mt19937 rng(1234 + t);
      struct Held {
        HostKvSequence seq;
        int64_t stamped_from_page;  // pages below this index are shared and not stamped
        float stamp;
      };
      std::vector<Held> held;
      for (int iter = 0; iter < 2000; ++iter) {
        if (held.size() < 6 && rng() % 2 == 0) {
          const int64_t tokens = 1 + rng() % 60;
          absl::StatusOr<HostKvSequence> seq;
          int64_t prefix = 0;
          if (!held.empty() && rng() % 3 == 0) {
            const HostKvSequence& base = held[rng() % held.size()].seq;
            prefix = std::min<int64_t>(base.pages_per_head(), store->PagesFor(tokens));
            seq = store->ReserveWithPrefix(base, prefix, tokens);
          } else {
            seq = store->Reserve(tokens);
          }
          if (!seq.ok()) {
            ASSERT_EQ(seq.status().code(), absl::StatusCode::kResourceExhausted);
            failures.fetch_add(1);
            continue;
          }
          successes.fetch_add(1);
          const float stamp = static_cast<float>(t * 1000000 + iter);
          for (int l = 0; l < o.num_layers; ++l) {
            for (int h = 0; h < o.num_kv_heads; ++h) {
              for (int64_t i = prefix; i < seq->pages_per_head(); ++i) {
                store->K(seq->page(l, h, i))[0] = stamp;
              }
            }
          }
          held.push_back({std::move(*seq), prefix, stamp});
        } else if (!held.empty()) {
          const size_t victim = rng() % held.size();
          Held& x = held[victim];
          for (int l = 0; l < o.num_layers; ++l) {
            for (int h = 0; h < o.num_kv_heads; ++h) {
              for (int64_t i = x.stamped_from_page; i < x.seq.pages_per_head(); ++i) {
                ASSERT_EQ(store->K(x.seq.page(l, h, i))[0], x.stamp);
              }
            }
          }
          store->Release(x.seq);
          std::swap(held[victim], held.back());
          held.pop_back();
        }
        ASSERT_LE(store->used_pages(), store->capacity_pages());
      }
      for (Held& x : held) store->Release(x.seq);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_GT(successes.load(), 1000);
  EXPECT_GT(failures.load(), 0);  // the store did fill up, so exhaustion raced too
  EXPECT_EQ(store->used_pages(), 0);
  for (PageId p = 0; p < store->capacity_pages(); ++p) ASSERT_EQ(store->refcount(p), 0);
}

}  // namespace
}  // namespace specula
