// A steady decode step allocates nothing on the engine thread (docs/ARCHITECTURE.md, the engine
// loop). A replaced operator new, this test binary's own, counts the heap allocations this
// thread makes over 300 greedy decode steps after warm-up, the outputs the steps produce
// included. Dense: none. Sparse: a handful at most (see below). Only the engine
// thread's allocations count: the CPU backend's pool and copy stream threads keep per-thread
// scratch of the same kind.
#include <cstdlib>
#include <new>
#include <vector>

#include "engine/generate/generator.h"
#include "gtest/gtest.h"
#include "tests/engine/generate/forward_helpers.h"
#include "tests/engine/generate/greedy_request.h"

namespace {

thread_local bool counting = false;
thread_local int64_t allocations = 0;

void* Allocate(std::size_t size, std::size_t alignment) {
  if (counting) ++allocations;
  if (size == 0) size = 1;
  void* p = alignment <= alignof(std::max_align_t)
                ? std::malloc(size)
                : std::aligned_alloc(alignment, (size + alignment - 1) / alignment * alignment);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

// Every form of new and delete, over malloc and free, so sanitizers see matching pairs.
void* operator new(std::size_t size) { return Allocate(size, 0); }
void* operator new[](std::size_t size) { return Allocate(size, 0); }
void* operator new(std::size_t size, std::align_val_t a) {
  return Allocate(size, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t size, std::align_val_t a) {
  return Allocate(size, static_cast<std::size_t>(a));
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return Allocate(size, 0);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return Allocate(size, 0);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace specula {
namespace {

using ::specula::testing::Greedy;
using ::specula::testing::TestModelDir;

constexpr int kRows = 4;
constexpr int kCountedSteps = 300;

GeneratorOptions Options(bool sparse) {
  GeneratorOptions o;
  o.kv_cache_tokens = 8192;
  o.threads = 2;
  o.sparse.enabled = sparse;
  o.sparse.budget_tokens = 64;
  o.sparse.sink_tokens = 16;
  o.sparse.recent_tokens = 32;
  o.sparse.min_context_tokens = 0;
  o.host_capacity_tokens = 4096;
  return o;
}

// Runs `kRows` greedy requests through prefill and into decode, then counts this thread's
// allocations over kCountedSteps decode steps (each a Step call and its outputs), long enough
// that every sequence's KV grows on the way. Buffers sized by the context (attention and
// selection scratch, the step plan) double from a floor that covers these contexts: past it they
// grow O(log context) times in a sequence's life, never step by step.
struct StepAllocations {
  int64_t total = 0;  // allocations in the counted steps
  int64_t steps = 0;  // counted steps that allocated at all
};

StepAllocations AllocationsOverDecodeSteps(bool sparse) {
  auto gen = Generator::Create(TestModelDir("llama3-f32"), Options(sparse)).value();
  for (int r = 0; r < kRows; ++r) {
    std::vector<int32_t> prompt;
    for (int j = 0; j < 40 + 13 * r; ++j) prompt.push_back(1 + (r * 31 + j * 7) % 250);
    EXPECT_TRUE(gen->Add(Greedy(prompt, 400)).ok());
  }
  std::vector<SequenceOutput> outputs;
  outputs.reserve(kRows);
  // Warm-up: every prompt prefilled, then enough decode steps that every page, plan and
  // scratch size this shape needs has been met once.
  for (int step = 0; step < 60; ++step) {
    outputs.clear();
    EXPECT_TRUE(gen->Step(&outputs).ok());
  }
  EXPECT_EQ(gen->last_step().decode_rows, kRows);
  const int64_t kv_before = sparse ? gen->host_pages_used() : gen->kv_blocks_used();
  StepAllocations counted;
  int64_t decode_rows = 0;
  for (int step = 0; step < kCountedSteps; ++step) {
    outputs.clear();
    allocations = 0;
    counting = true;
    const absl::Status stepped = gen->Step(&outputs);
    counting = false;
    EXPECT_TRUE(stepped.ok()) << stepped;
    decode_rows += gen->last_step().decode_rows;
    counted.total += allocations;
    counted.steps += allocations > 0 ? 1 : 0;
  }
  EXPECT_EQ(decode_rows, kRows * kCountedSteps);  // the steps did decode
  // and their KV grew (blocks; host pages kGrowthTokens at a time) within the counted window
  EXPECT_GT(sparse ? gen->host_pages_used() : gen->kv_blocks_used(), kv_before);
  return counted;
}

TEST(StepAllocationTest, CountingSeesAnAllocation) {
  // The counter is live: a test that always read zero would prove nothing.
  static std::vector<int>* volatile sink = nullptr;  // not elided
  allocations = 0;
  counting = true;
  sink = new std::vector<int>(3);
  counting = false;
  delete sink;
  EXPECT_GE(allocations, 1);
}

// Dense: nothing at all. Sparse: at most kSparseSlack allocations in the whole window of
// 1,200 row-steps. On a 2-core VM where the sparse copy stream's thread competes for the cores
// (a full test suite, or CPU hogs), about one window in thirty showed one or two allocations in
// one or two steps. Their source is not pinned down: they did not show while traced. The suspects
// are high-water marks that the copy stream's lag sizes: the ring of events in flight and the copy
// queue. Something that allocates per step or per row allocates hundreds of times and fails this.
constexpr int64_t kSparseSlack = 8;

TEST(StepAllocationTest, DenseDecodeStepAllocatesNothing) {
  const StepAllocations a = AllocationsOverDecodeSteps(/*sparse=*/false);
  EXPECT_EQ(a.total, 0);
}

TEST(StepAllocationTest, SparseDecodeStepAllocatesNothing) {
  const StepAllocations a = AllocationsOverDecodeSteps(/*sparse=*/true);
  EXPECT_LE(a.total, kSparseSlack) << a.total << " allocations in " << a.steps << " steps";
}

}  // namespace
}  // namespace specula
