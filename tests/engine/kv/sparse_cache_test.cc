// SparseKvCache's admission checks against the backend's limits.
#include <string>

#include "engine/cpu/cpu_backend.h"
#include "engine/kv/sparse_kv_cache.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

// A backend whose page selection holds few cache slots (a GPU's shared memory bounds them).
class FewSlotsBackend : public CpuBackend {
 public:
  FewSlotsBackend() : CpuBackend(1) {}
  int32_t max_sparse_cache_slots() const override { return 6; }
};

TEST(SparseKvCacheTest, ABudgetNeedingMoreSlotsThanTheDeviceSelectsIsRefused) {
  FewSlotsBackend backend;
  KvPool pool = KvPool::Create(backend, KvPoolOptions{1, 1, 16, 16, 256}).value();
  SparseOptions o;
  o.enabled = true;
  o.budget_tokens = 64;  // 4 pages + 2 extra: 6 slots, the most it holds
  o.sink_tokens = 16;
  o.recent_tokens = 16;
  auto store = HostKvStore::Create(pool.HostStoreOptions(8192)).value();
  auto cache =
      SparseKvCache::Create(o, SparseModelShape{1, 2, 1, 16, AttentionScale(16)}, backend, pool, *store).value();
  EXPECT_TRUE(cache->CheckCapacity(4096, 0).ok());
  const absl::Status s = cache->CheckCapacity(4096, 128);  // 8 + 4 slots
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("more than this device's page selection holds (6)"));
  EXPECT_EQ(cache->Admit(4096, 128, 100).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->host_pages_used(), 0);
}

}  // namespace
}  // namespace specula
