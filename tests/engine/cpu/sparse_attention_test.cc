// SparseDecodeAttention: with every page of a sequence it is bit-identical to PagedAttention
// (the "full budget equals dense" invariant at the op level), and with a subset it is exact
// softmax attention over just the chosen tokens.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/kv/kv_pool.h"
#include "gtest/gtest.h"
#include "tests/engine/cpu/device_data.h"
#include "tests/engine/cpu/random_vector.h"

namespace specula {
namespace {

using ::specula::testing::DenseBatch;
using ::specula::testing::DeviceData;
using ::specula::testing::PageLists;
using ::specula::testing::RandomVector;

// Decode rows of several sequences over one dense layer, plus the pool view of the same memory.
struct DecodeSetup {
  static constexpr int kHeads = 4, kKvHeads = 2, kHeadDim = 8, kPage = 4;
  CpuBackend backend{2};
  DeviceData data{backend};
  KvPool pool;
  std::vector<int> kv_lens = {11, 4, 1, 17};
  std::vector<std::vector<int32_t>> blocks;
  std::vector<float> q;

  explicit DecodeSetup(DType dtype = DType::kF32) {
    KvPoolOptions options{1, kKvHeads, kHeadDim, kPage, 32};
    options.dtype = dtype;
    pool = KvPool::Create(backend, options).value();
    const KvLayerView layer = pool.Layer(0);
    uint32_t seed = 5;
    for (int len : kv_lens) {
      blocks.push_back(pool.Allocate(pool.BlocksFor(len)).value());
      auto k = RandomVector(len * kKvHeads * kHeadDim, seed++);
      auto v = RandomVector(len * kKvHeads * kHeadDim, seed++);
      std::vector<int32_t> wb, wo;
      for (int t = 0; t < len; ++t) {
        wb.push_back(blocks.back()[t / kPage]);
        wo.push_back(t % kPage);
      }
      backend.WriteKv(Mat(k.data(), len, kKvHeads * kHeadDim),
                      Mat(v.data(), len, kKvHeads * kHeadDim), KvWrite{data.Put(wb), data.Put(wo)},
                      layer);
    }
    q = RandomVector(kv_lens.size() * kHeads * kHeadDim, 99);
  }
  int rows() const { return static_cast<int>(kv_lens.size()); }
  PagePoolView Pool() {
    const KvLayerView layer = pool.Layer(0);
    return PagePoolView{layer.base, layer.dtype, kPage, kHeadDim};
  }
  // Page id in the pool view of (sequence s, page index i, KV head h).
  int32_t PageId(int s, int i, int h) const { return blocks[s][i] * kKvHeads + h; }
  const float* Key(int s, int pos, int h) const {
    return static_cast<const float*>(pool.Layer(0).base) +
           PageId(s, pos / kPage, h) * pool.Layer(0).page_elems() + (pos % kPage) * kHeadDim;
  }
  const float* Value(int s, int pos, int h) const { return Key(s, pos, h) + kPage * kHeadDim; }
};

class EveryPageTest : public ::testing::TestWithParam<DType> {};

// In every KV dtype: the invariant must hold for the bf16 pages a GPU serves from too.
TEST_P(EveryPageTest, InOrderIsBitIdenticalToPagedAttention) {
  DecodeSetup d(GetParam());
  const int width = DecodeSetup::kHeads * DecodeSetup::kHeadDim;
  DenseBatch batch;
  for (int s = 0; s < d.rows(); ++s) batch.Add(1, d.kv_lens[s], d.blocks[s]);
  std::vector<float> dense(d.rows() * width);
  Mat dense_m(dense.data(), d.rows(), width);
  d.backend.PagedAttention(Mat(d.q.data(), d.rows(), width),
                           batch.Batch(d.data, DecodeSetup::kHeads, 0.35f), d.pool.Layer(0),
                           &dense_m);

  PageLists lists;
  for (int s = 0; s < d.rows(); ++s) {
    for (int h = 0; h < DecodeSetup::kKvHeads; ++h) {
      const int n_pages = (d.kv_lens[s] + DecodeSetup::kPage - 1) / DecodeSetup::kPage;
      std::vector<int32_t> pages, tokens;
      for (int i = 0; i < n_pages; ++i) {
        pages.push_back(d.PageId(s, i, h));
        tokens.push_back(std::min(DecodeSetup::kPage, d.kv_lens[s] - i * DecodeSetup::kPage));
      }
      lists.Add(pages, tokens);
    }
  }
  std::vector<float> sparse(d.rows() * width);
  Mat sparse_m(sparse.data(), d.rows(), width);
  d.backend.SparseDecodeAttention(
      Mat(d.q.data(), d.rows(), width),
      lists.Batch(d.data, d.rows(), DecodeSetup::kHeads, DecodeSetup::kKvHeads, 0.35f), d.Pool(),
      PagePoolView{}, &sparse_m);
  for (size_t i = 0; i < dense.size(); ++i) ASSERT_EQ(sparse[i], dense[i]) << "element " << i;
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, EveryPageTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

// A list may mix device pages and pages of the host store (HostPageRef: a selected page read
// from host memory, miss_policy fetch): the host copy of a page gives bit-identical output.
TEST(SparseDecodeAttentionTest, HostPageRefsReadTheHostPool) {
  DecodeSetup d;
  const int width = DecodeSetup::kHeads * DecodeSetup::kHeadDim;
  const PagePoolView dev = d.Pool();
  // The host pool: the device pool's pages copied at indices 1000 + p.
  const size_t pages = static_cast<size_t>(d.pool.num_blocks()) * DecodeSetup::kKvHeads;
  auto host_memory = d.backend.AllocatePinnedHost((1000 + pages) * dev.page_bytes()).value();
  const PagePoolView host{host_memory.data(), dev.dtype, DecodeSetup::kPage, DecodeSetup::kHeadDim};
  for (size_t p = 0; p < pages; ++p) {
    std::memcpy(host.page(1000 + p), dev.page(p), dev.page_bytes());
  }
  PageLists device_only, mixed;
  for (int s = 0; s < d.rows(); ++s) {
    for (int h = 0; h < DecodeSetup::kKvHeads; ++h) {
      const int n_pages = (d.kv_lens[s] + DecodeSetup::kPage - 1) / DecodeSetup::kPage;
      std::vector<int32_t> on_device, some_on_host, tokens;
      for (int i = 0; i < n_pages; ++i) {
        const int32_t page = d.PageId(s, i, h);
        on_device.push_back(page);
        some_on_host.push_back(i % 2 == 0 ? HostPageRef(1000 + page) : page);
        tokens.push_back(std::min(DecodeSetup::kPage, d.kv_lens[s] - i * DecodeSetup::kPage));
      }
      device_only.Add(on_device, tokens);
      mixed.Add(some_on_host, tokens);
    }
  }
  auto run = [&](const PageLists& lists) {
    std::vector<float> out(d.rows() * width);
    Mat om(out.data(), d.rows(), width);
    d.backend.SparseDecodeAttention(
        Mat(d.q.data(), d.rows(), width),
        lists.Batch(d.data, d.rows(), DecodeSetup::kHeads, DecodeSetup::kKvHeads, 0.35f), dev, host,
        &om);
    return out;
  };
  EXPECT_EQ(run(mixed), run(device_only));
}

TEST(SparseDecodeAttentionTest, SubsetIsExactAttentionOverTheChosenTokens) {
  DecodeSetup d;
  const int width = DecodeSetup::kHeads * DecodeSetup::kHeadDim;
  const int group = DecodeSetup::kHeads / DecodeSetup::kKvHeads;
  // Per (row, KV head): a different, out-of-order choice of pages, last one partial.
  PageLists lists;
  std::vector<std::vector<std::pair<int, int>>> chosen;  // (page index, tokens) per list
  for (int s = 0; s < d.rows(); ++s) {
    const int n_pages = (d.kv_lens[s] + DecodeSetup::kPage - 1) / DecodeSetup::kPage;
    for (int h = 0; h < DecodeSetup::kKvHeads; ++h) {
      std::vector<std::pair<int, int>> pick;
      for (int i = n_pages - 1; i >= 0; i -= 1 + (s + h) % 2) {
        pick.emplace_back(i, std::min(DecodeSetup::kPage, d.kv_lens[s] - i * DecodeSetup::kPage));
      }
      std::vector<int32_t> pages, tokens;
      for (auto [i, n] : pick) {
        pages.push_back(d.PageId(s, i, h));
        tokens.push_back(n);
      }
      lists.Add(pages, tokens);
      chosen.push_back(pick);
    }
  }
  std::vector<float> out(d.rows() * width);
  Mat om(out.data(), d.rows(), width);
  d.backend.SparseDecodeAttention(
      Mat(d.q.data(), d.rows(), width),
      lists.Batch(d.data, d.rows(), DecodeSetup::kHeads, DecodeSetup::kKvHeads, 0.5f), d.Pool(),
      PagePoolView{}, &om);
  for (int s = 0; s < d.rows(); ++s) {
    for (int h = 0; h < DecodeSetup::kHeads; ++h) {
      const int g = h / group;
      std::vector<int> positions;
      for (auto [i, n] : chosen[s * DecodeSetup::kKvHeads + g]) {
        for (int t = 0; t < n; ++t) positions.push_back(i * DecodeSetup::kPage + t);
      }
      const float* qv = d.q.data() + (s * DecodeSetup::kHeads + h) * DecodeSetup::kHeadDim;
      std::vector<double> p;
      double mx = -1e30, sum = 0;
      for (int pos : positions) {
        double dot = 0;
        for (int c = 0; c < DecodeSetup::kHeadDim; ++c) dot += qv[c] * d.Key(s, pos, g)[c];
        p.push_back(dot * 0.5);
        mx = std::max(mx, p.back());
      }
      for (double& x : p) sum += (x = std::exp(x - mx));
      for (int c = 0; c < DecodeSetup::kHeadDim; ++c) {
        double ref = 0;
        for (size_t j = 0; j < positions.size(); ++j) {
          ref += p[j] / sum * d.Value(s, positions[j], g)[c];
        }
        EXPECT_NEAR(out[(s * DecodeSetup::kHeads + h) * DecodeSetup::kHeadDim + c], ref, 1e-5)
            << "row " << s << " head " << h;
      }
    }
  }
}

}  // namespace
}  // namespace specula
