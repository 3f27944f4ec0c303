// The CUDA backend against the CPU reference, operation by operation: the same inputs on both
// backends, outputs compared element by element within each operation's stated tolerance.
// Compiled in every CUDA build; each test skips when no GPU is visible (CI), and runs in
// tools/gpu/check.sh on a GPU machine.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend/backend_factory.h"
#include "engine/common/dtype.h"
#include "engine/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/cuda/cuda_test_backend.h"
#include "tests/engine/cpu/device_data.h"
#include "tests/engine/cpu/random_vector.h"
#include "tests/engine/cpu/stored_parts.h"

namespace specula {
namespace {

using ::specula::testing::DenseBatch;
using ::specula::testing::DeviceData;
using ::specula::testing::MakeStoredParts;
using ::specula::testing::PageLists;
using ::specula::testing::RandomVector;
using ::specula::testing::StoredParts;

// Values a bf16 weight holds exactly, so the CPU (fp32 weights) and CUDA (bf16 weights) backends
// multiply by the same numbers.
std::vector<float> RoundedToBf16(std::vector<float> v) {
  for (float& x : v) x = Bf16ToFloat(FloatToBf16(x));
  return v;
}

// Memory of one shape on both backends, filled with the same bytes.
struct Twin {
  DeviceBuffer cpu, gpu;
  size_t bytes = 0;
};

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto gpu = testing::CreateCudaBackend();
    if (!gpu.ok()) GTEST_SKIP() << "no GPU: " << gpu.status();
    gpu_ = std::move(*gpu);
    gpu_data_ = std::make_unique<DeviceData>(*gpu_);
  }

  Twin Make(const void* host, size_t bytes) {
    Twin t;
    t.bytes = bytes;
    t.cpu = cpu_.Allocate(bytes).value();
    t.gpu = gpu_->Allocate(bytes).value();
    std::memcpy(t.cpu.data(), host, bytes);
    gpu_->CopyToDevice(t.gpu.data(), host, bytes);
    return t;
  }
  Twin Make(const std::vector<float>& host) { return Make(host.data(), host.size() * 4); }
  Twin Zeros(size_t bytes) { return Make(std::vector<char>(bytes, 0).data(), bytes); }

  std::vector<float> ReadGpu(const Twin& t) {
    std::vector<float> out(t.bytes / sizeof(float));
    gpu_->CopyToHost(out.data(), t.gpu.data(), t.bytes);
    return out;
  }
  std::vector<float> ReadCpu(const Twin& t) {
    std::vector<float> out(t.bytes / sizeof(float));
    std::memcpy(out.data(), t.cpu.data(), t.bytes);
    return out;
  }
  std::vector<char> ReadGpuBytes(const Twin& t) {
    std::vector<char> out(t.bytes);
    gpu_->CopyToHost(out.data(), t.gpu.data(), t.bytes);
    return out;
  }

  // |gpu - cpu| <= rel * |cpu| + abs, element by element.
  void ExpectClose(const Twin& t, double rel, double abs, const std::string& what) {
    const std::vector<float> g = ReadGpu(t), c = ReadCpu(t);
    int reported = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      const double diff = std::abs(static_cast<double>(g[i]) - c[i]);
      if (!(diff <= rel * std::abs(c[i]) + abs) && reported++ < 5) {
        ADD_FAILURE() << what << " [" << i << "]: cuda " << g[i] << " cpu " << c[i];
      }
    }
  }

  Backend& side(int i) { return i == 0 ? static_cast<Backend&>(cpu_) : *gpu_; }
  // Metadata in each backend's memory.
  DeviceData& data(int i) { return i == 0 ? cpu_data_ : *gpu_data_; }

  CpuBackend cpu_{2};
  DeviceData cpu_data_{cpu_};
  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<DeviceData> gpu_data_;
};

Mat Of(const DeviceBuffer& b, int64_t rows, int64_t cols, int64_t stride = 0) {
  return Mat(b.as<float>(), rows, cols, stride == 0 ? cols : stride);
}

TEST_F(CudaBackendTest, ElementwiseOpsMatchTheCpu) {
  constexpr int64_t kRows = 7, kDim = 96, kVocab = 50, kHeads = 3, kHeadDim = 32;
  const std::vector<float> table = RoundedToBf16(RandomVector(kVocab * kDim, 1));
  const std::vector<int32_t> ids = {3, 0, 49, 17, 17, 8, 22};
  const std::vector<int32_t> positions = {0, 1, 7, 4095, 65536, 131071, 1000003};
  const std::vector<float> inv_freq = [] {
    std::vector<float> f(kHeadDim / 2);
    for (size_t i = 0; i < f.size(); ++i) f[i] = std::pow(500000.0f, -2.0f * i / kHeadDim);
    return f;
  }();
  Weight cpu_table = cpu_.UploadWeight(table.data(), kVocab, kDim).value();
  Weight gpu_table = gpu_->UploadWeight(table.data(), kVocab, kDim).value();
  const std::vector<float> norm = RandomVector(kDim, 2), norm_head = RandomVector(kHeadDim, 3);
  Weight cpu_norm = cpu_.UploadWeight(norm.data(), 1, kDim).value();
  Weight gpu_norm = gpu_->UploadWeight(norm.data(), 1, kDim).value();
  Weight cpu_norm_head = cpu_.UploadWeight(norm_head.data(), 1, kHeadDim).value();
  Weight gpu_norm_head = gpu_->UploadWeight(norm_head.data(), 1, kHeadDim).value();

  Twin x = Zeros(kRows * kDim * 4);
  Twin gate_up = Make(RandomVector(kRows * 2 * kDim, 4));
  Twin act = Zeros(kRows * kDim * 4);
  Twin other = Make(RandomVector(kRows * kDim, 5));
  Twin gathered = Zeros(3 * kDim * 4);
  const std::vector<int32_t> gather_rows = {6, 0, 3};
  for (int side = 0; side < 2; ++side) {
    Backend& b = side == 0 ? static_cast<Backend&>(cpu_) : *gpu_;
    auto buf = [&](const Twin& t) -> const DeviceBuffer& { return side == 0 ? t.cpu : t.gpu; };
    Mat xm = Of(buf(x), kRows, kDim);
    b.Embed(data(side).Put(ids), side == 0 ? cpu_table : gpu_table, &xm);
    b.RmsNorm(xm, side == 0 ? cpu_norm : gpu_norm, 1e-6f, &xm);  // in place
    // Per-head norm on a column block with a row stride, as Qwen3's q/k norm does.
    Mat head = xm.Cols(kHeadDim, kHeadDim);
    b.RmsNorm(head, side == 0 ? cpu_norm_head : gpu_norm_head, 1e-6f, &head);
    Mat rope = xm.Cols(0, kHeads * kHeadDim);
    b.Rope(&rope, kHeads, kHeadDim, data(side).Put(positions), data(side).Put(inv_freq));
    Mat am = Of(buf(act), kRows, kDim);
    b.SwiGlu(Of(buf(gate_up), kRows, 2 * kDim), &am);
    b.Add(&am, Of(buf(other), kRows, kDim));
    b.Add(&xm, am);
    Mat gm = Of(buf(gathered), 3, kDim);
    b.GatherRows(xm, data(side).Put(gather_rows), &gm);
  }
  ExpectClose(x, 1e-5, 1e-5, "embed+norm+rope+swiglu+add");
  ExpectClose(act, 1e-5, 1e-6, "swiglu+add");
  ExpectClose(gathered, 1e-5, 1e-5, "gather rows");
}

// Rows up to 16 * 256 columns are normalized from registers, longer ones in a loop: both sides of
// the boundary, a row that leaves threads idle, and several rows per launch.
TEST_F(CudaBackendTest, RmsNormMatchesTheCpuFromRegistersAndInTheLoop) {
  constexpr int64_t kRows = 3;
  for (const int64_t cols : {int64_t{1000}, int64_t{4096}, int64_t{4097}, int64_t{9000}}) {
    const std::vector<float> norm = RandomVector(cols, 21);
    Weight cpu_norm = cpu_.UploadWeight(norm.data(), 1, cols).value();
    Weight gpu_norm = gpu_->UploadWeight(norm.data(), 1, cols).value();
    Twin x = Make(RandomVector(kRows * cols, 22));
    Twin y = Zeros(kRows * cols * 4);
    Mat cpu_out = Of(y.cpu, kRows, cols), gpu_out = Of(y.gpu, kRows, cols);
    cpu_.RmsNorm(Of(x.cpu, kRows, cols), cpu_norm, 1e-6f, &cpu_out);
    gpu_->RmsNorm(Of(x.gpu, kRows, cols), gpu_norm, 1e-6f, &gpu_out);
    ExpectClose(y, 1e-5, 1e-6, absl::StrCat("rms norm of ", cols, " columns"));
  }
}

// The fused norms against the CPU backend's compositions (Add then RmsNorm; RmsNorm per head):
// the residual written back to x, the norm's output over the residual it read (as the forward
// pass calls it), from registers and in the loop, and every head of a strided row.
TEST_F(CudaBackendTest, FusedNormsMatchTheCompositionsTheyReplace) {
  constexpr int64_t kRows = 5;
  for (const int64_t cols : {int64_t{2048}, int64_t{4100}}) {
    const std::vector<float> norm = RandomVector(cols, 31);
    Weight cpu_norm = cpu_.UploadWeight(norm.data(), 1, cols).value();
    Weight gpu_norm = gpu_->UploadWeight(norm.data(), 1, cols).value();
    Twin x = Make(RandomVector(kRows * (cols + 3), 32));
    Twin residual = Make(RandomVector(kRows * cols, 33));
    for (int i = 0; i < 2; ++i) {
      Backend& b = side(i);
      Mat xm = Of(i == 0 ? x.cpu : x.gpu, kRows, cols, cols + 3);
      Mat rm = Of(i == 0 ? residual.cpu : residual.gpu, kRows, cols);
      b.AddRmsNorm(&xm, rm, i == 0 ? cpu_norm : gpu_norm, 1e-6f, &rm);
    }
    ExpectClose(x, 1e-6, 1e-7, absl::StrCat("residual sum over ", cols, " columns"));
    ExpectClose(residual, 1e-5, 1e-6, absl::StrCat("norm of the sum over ", cols, " columns"));
  }
  constexpr int32_t kHeads = 6, kHeadDim = 128;
  const std::vector<float> head_norm = RandomVector(kHeadDim, 34);
  Weight cpu_head = cpu_.UploadWeight(head_norm.data(), 1, kHeadDim).value();
  Weight gpu_head = gpu_->UploadWeight(head_norm.data(), 1, kHeadDim).value();
  constexpr int64_t kStride = kHeads * kHeadDim + 40;
  Twin q = Make(RandomVector(kRows * kStride, 35));
  for (int i = 0; i < 2; ++i) {
    // Heads 1..5 of each row, leaving head 0's columns and the row's tail untouched.
    Mat heads = Of(i == 0 ? q.cpu : q.gpu, kRows, kStride).Cols(kHeadDim, 5 * kHeadDim);
    side(i).HeadRmsNorm(&heads, 5, kHeadDim, i == 0 ? cpu_head : gpu_head, 1e-6f);
  }
  ExpectClose(q, 1e-5, 1e-6, "per-head norm");
}

// One row takes the skinny kernel: fp32 x, so it differs from the CPU only by the order of fp32
// sums (bounded here by 2^-14 of the sum of |x||w|, far below bf16 rounding of x). More rows
// multiply bf16 inputs (2-16 rows on the few-row tensor-core kernel when `in` is a multiple of
// 32, else and beyond on cuBLAS): the activations are rounded to bf16 (relative error 2^-9), so
// each output may differ from the fp32 product by about 2^-8 of the sum of |x||w| it adds up.
// Shapes: a row of fewer 8-element chunks than lanes, one whose lanes take several rounds of
// loads, the last partial (2056: cuBLAS from 2 rows); for the few-row kernel 160 columns in
// (warps idle past 5 chunks of 32), 2048 (4 chunks a warp) and 1056 (a second round half full),
// 72 columns out (a partial 16-column tile) and 16400 (two tiles a block on GPUs of up to 256
// SMs, the last partial). Rows: 1; 2, 5, 8 (one 8-row tile); 9, 16 (two, the kernel's most); 17
// and 67 (cuBLAS). y has a guard row and guard columns that must keep their zeros.
TEST_F(CudaBackendTest, GemmMatchesTheCpuWithinBf16InputRounding) {
  struct Shape {
    int64_t in, out;
  };
  for (const Shape shape :
       {Shape{160, 72}, Shape{2056, 72}, Shape{2048, 72}, Shape{1056, 40}, Shape{64, 16400}}) {
    const int64_t in = shape.in, out = shape.out, stride = out + 4;
    const std::vector<float> w = RoundedToBf16(RandomVector(out * in, 10));
    const std::vector<float> bias = RandomVector(out, 11);
    Weight cw = cpu_.UploadWeight(w.data(), out, in).value();
    Weight gw = gpu_->UploadWeight(w.data(), out, in).value();
    Weight cb = cpu_.UploadWeight(bias.data(), 1, out).value();
    Weight gb = gpu_->UploadWeight(bias.data(), 1, out).value();
    for (int64_t m : {1, 2, 5, 8, 9, 16, 17, 67}) {
      const std::vector<float> xh = RandomVector(m * (in + 8), 12 + m);
      Twin x = Make(xh);
      Twin y = Zeros((m + 1) * stride * 4);
      for (int side = 0; side < 2; ++side) {
        Backend& b = side == 0 ? static_cast<Backend&>(cpu_) : *gpu_;
        Mat xm = Of(side == 0 ? x.cpu : x.gpu, m, in, in + 8);
        Mat ym = Of(side == 0 ? y.cpu : y.gpu, m, out, stride);
        b.Gemm(xm, side == 0 ? cw : gw, side == 0 ? cb : gb, &ym);
      }
      const std::vector<float> g = ReadGpu(y), c = ReadCpu(y);
      int reported = 0;
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t o = 0; o < out; ++o) {
          double magnitude = std::abs(bias[o]);
          for (int64_t i = 0; i < in; ++i)
            magnitude += std::abs(xh[r * (in + 8) + i] * w[o * in + i]);
          const size_t at = r * stride + o;
          const double bound = magnitude * std::ldexp(1.0, m == 1 ? -14 : -8) + 1e-5;
          if (!(std::abs(g[at] - c[at]) <= bound) && reported++ < 5) {
            ADD_FAILURE() << in << "x" << out << ", " << m << " rows: [" << r << "][" << o
                          << "] cuda " << g[at] << " cpu " << c[at];
          }
        }
      }
      for (int64_t i = 0; i < (m + 1) * stride; ++i) {
        if (i / stride < m && i % stride < out) continue;
        if (g[i] != 0.0f && reported++ < 5) {
          ADD_FAILURE() << in << "x" << out << ", " << m << " rows: guard cell " << i << " written";
        }
      }
    }
  }
}

// The GEMMs of one row and of a few are dependent launches: one may start while the kernel
// ahead of it (here the norm that writes its x, which lets it start at once; for several rows,
// x's conversion to bf16 after the norm) still runs. It must wait for that kernel before it reads
// x, and before it writes y, which here overwrites the start of the norm's input. The norm is one
// block a row looping over a 64K-column row (it reads its input twice), and each round
// normalizes a different input into the same x, so a GEMM that read x early would see the round
// before's x (or the first round's zeros), and one that wrote y early would change what the norm
// reads. 27 columns: the last block has idle warps. Launched as issued, then replayed from a
// recording (a CUDA graph, where the dependent launch is an edge of its own kind). On a GPU
// before sm_90 the launch is an ordinary one and this passes trivially.
TEST_F(CudaBackendTest, DecodeGemmsReadTheXTheKernelAheadWrote) {
  constexpr int64_t kIn = 65536, kOut = 27;
  const std::vector<float> w = RoundedToBf16(RandomVector(kOut * kIn, 40));
  const std::vector<float> norm = RandomVector(kIn, 41), bias = RandomVector(kOut, 42);
  Weight cw = cpu_.UploadWeight(w.data(), kOut, kIn).value();
  Weight gw = gpu_->UploadWeight(w.data(), kOut, kIn).value();
  Weight cb = cpu_.UploadWeight(bias.data(), 1, kOut).value();
  Weight gb = gpu_->UploadWeight(bias.data(), 1, kOut).value();
  Weight cpu_norm = cpu_.UploadWeight(norm.data(), 1, kIn).value();
  Weight gpu_norm = gpu_->UploadWeight(norm.data(), 1, kIn).value();
  for (const int64_t rows : {1, 4, 12}) {
    Twin x = Zeros(rows * kIn * 4), input = Zeros(rows * kIn * 4);
    auto step = [&](int i) {
      Mat xm = Of(i == 0 ? x.cpu : x.gpu, rows, kIn);
      Mat ym = Of(i == 0 ? input.cpu : input.gpu, rows, kOut, kIn);  // y over the norm's input
      side(i).RmsNorm(Of(i == 0 ? input.cpu : input.gpu, rows, kIn), i == 0 ? cpu_norm : gpu_norm,
                      1e-6f, &xm);
      side(i).Gemm(xm, i == 0 ? cw : gw, i == 0 ? cb : gb, &ym);
    };
    auto fill = [&](int round) {
      const std::vector<float> values = RandomVector(rows * kIn, 43 + round);
      std::memcpy(input.cpu.data(), values.data(), rows * kIn * 4);
      gpu_->CopyToDevice(input.gpu.data(), values.data(), rows * kIn * 4);
    };
    auto expect_equal_sides = [&](const std::string& what) {
      ExpectClose(x, 1e-5, 1e-6, what + ": the norm's output");
      const std::vector<float> xs = ReadCpu(x), g = ReadGpu(input), c = ReadCpu(input);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t o = 0; o < kOut; ++o) {
          double magnitude = std::abs(bias[o]);
          for (int64_t i = 0; i < kIn; ++i) magnitude += std::abs(xs[r * kIn + i] * w[o * kIn + i]);
          // One row: fp32 sums in another order, and the norms' last-bit differences in x; more:
          // x rounded to bf16.
          const double bound = magnitude * std::ldexp(1.0, rows == 1 ? -14 : -8) + 1e-5;
          EXPECT_NEAR(g[r * kIn + o], c[r * kIn + o], bound)
              << what << " [" << r << "][" << o << "]";
        }
      }
    };
    for (int round = 0; round < 4; ++round) {
      fill(round);
      step(0);
      step(1);
      expect_equal_sides(absl::StrCat(rows, " rows, launched, round ", round));
    }
    std::unique_ptr<RecordedOps> recorded = gpu_->Record([&] { step(1); });
    ASSERT_NE(recorded, nullptr);
    for (int round = 4; round < 8; ++round) {
      fill(round);
      step(0);
      ASSERT_TRUE(recorded->Replay());
      expect_equal_sides(absl::StrCat(rows, " rows, replayed, round ", round));
    }
  }
}

// Paged KV of one layer on both backends, written through WriteKv from the same fp32 K/V.
struct KvSetup {
  int32_t kv_heads, head_dim, page_size;
  DType dtype;
  int32_t num_blocks;
  Twin pages;

  size_t page_elems() const { return 2 * static_cast<size_t>(page_size) * head_dim; }
  KvLayerView View(const DeviceBuffer& b) const {
    return KvLayerView{b.data(), dtype, kv_heads, page_size, head_dim};
  }
};

class CudaKvTest : public CudaBackendTest,
                   public ::testing::WithParamInterface<std::tuple<DType, int, int>> {
 protected:
  DType dtype() const { return std::get<0>(GetParam()); }
  int head_dim() const { return std::get<1>(GetParam()); }
  int group() const { return std::get<2>(GetParam()); }

  // Sequences of `lens` tokens, each with its own shuffled blocks (so tables have holes), and
  // their K/V written on both backends.
  KvSetup Write(const std::vector<int>& lens, std::vector<std::vector<int32_t>>* tables) {
    KvSetup s{2, head_dim(), 16, dtype(), 0, {}};
    for (int len : lens) s.num_blocks += (len + s.page_size - 1) / s.page_size + 1;
    s.pages =
        Zeros(static_cast<size_t>(s.num_blocks) * s.kv_heads * s.page_elems() * DTypeSize(s.dtype));
    std::vector<int32_t> order(s.num_blocks);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(7));
    size_t next = 0;
    uint32_t seed = 100;
    for (int len : lens) {
      std::vector<int32_t> table;
      for (int i = 0; i < (len + s.page_size - 1) / s.page_size; ++i)
        table.push_back(order[next++]);
      ++next;  // a hole: a block no sequence uses
      const int64_t width = static_cast<int64_t>(s.kv_heads) * s.head_dim;
      Twin k = Make(RandomVector(len * width, seed++)), v = Make(RandomVector(len * width, seed++));
      std::vector<int32_t> wb, wo;
      for (int t = 0; t < len; ++t) {
        wb.push_back(table[t / s.page_size]);
        wo.push_back(t % s.page_size);
      }
      cpu_.WriteKv(Of(k.cpu, len, width), Of(v.cpu, len, width),
                   KvWrite{cpu_data_.Put(wb), cpu_data_.Put(wo)}, s.View(s.pages.cpu));
      gpu_->WriteKv(Of(k.gpu, len, width), Of(v.gpu, len, width),
                    KvWrite{gpu_data_->Put(wb), gpu_data_->Put(wo)}, s.View(s.pages.gpu));
      tables->push_back(std::move(table));
    }
    return s;
  }
};

TEST_P(CudaKvTest, WriteKvStoresTheSameBytes) {
  std::vector<std::vector<int32_t>> tables;
  KvSetup s = Write({1, 16, 37}, &tables);
  std::vector<char> g = ReadGpuBytes(s.pages);
  EXPECT_EQ(std::memcmp(g.data(), s.pages.cpu.data(), g.size()), 0);
}

TEST_P(CudaKvTest, PagedAttentionMatchesTheCpu) {
  // Decode rows (q_len 1) over short and long contexts, and one prefill chunk (causal).
  const std::vector<int> lens = {1, 17, 300, 40};
  std::vector<std::vector<int32_t>> tables;
  KvSetup s = Write(lens, &tables);
  DenseBatch dense;
  for (size_t i = 0; i < lens.size(); ++i) {
    dense.Add(i + 1 == lens.size() ? 9 : 1, lens[i], tables[i]);
  }
  const int32_t rows = dense.rows;
  const int heads = s.kv_heads * group();
  Twin q = Make(RandomVector(rows * heads * head_dim(), 5));
  Twin out = Zeros(static_cast<size_t>(rows) * heads * head_dim() * 4);
  for (int i = 0; i < 2; ++i) {
    Backend& b = side(i);
    const int64_t width = static_cast<int64_t>(heads) * head_dim();
    Mat om = Of(i == 0 ? out.cpu : out.gpu, rows, width);
    b.PagedAttention(Of(i == 0 ? q.cpu : q.gpu, rows, width),
                     dense.Batch(data(i), heads, AttentionScale(head_dim())),
                     s.View(i == 0 ? s.pages.cpu : s.pages.gpu), &om);
  }
  ExpectClose(out, 1e-4, 1e-5, "paged attention");
}

TEST_P(CudaKvTest, SparseDecodeAttentionMatchesTheCpu) {
  // Row 0 picks pages with holes and partial tokens; row 1 reads a long list (split-K).
  std::vector<std::vector<int32_t>> tables;
  KvSetup s = Write({208, 2000}, &tables);  // whole pages: every token read was written
  PageLists lists;
  for (int row = 0; row < 2; ++row) {
    for (int h = 0; h < s.kv_heads; ++h) {
      const std::vector<int32_t>& t = tables[row];
      std::vector<int32_t> pages, tokens;
      for (size_t i = h; i < t.size(); i += row == 0 ? 3 : 1) {
        pages.push_back(t[i] * s.kv_heads + h);
        // Full pages, except a page cut short now and then (as the window's last page is).
        tokens.push_back(i % 5 == 4 ? 1 + static_cast<int32_t>(i % s.page_size) : s.page_size);
      }
      lists.Add(pages, tokens);
    }
  }
  const int heads = s.kv_heads * group();
  const int64_t width = static_cast<int64_t>(heads) * head_dim();
  Twin q = Make(RandomVector(2 * width, 6));
  Twin out = Zeros(2 * width * 4);
  for (int i = 0; i < 2; ++i) {
    const DeviceBuffer& base = i == 0 ? s.pages.cpu : s.pages.gpu;
    Mat om = Of(i == 0 ? out.cpu : out.gpu, 2, width);
    side(i).SparseDecodeAttention(
        Of(i == 0 ? q.cpu : q.gpu, 2, width),
        lists.Batch(data(i), 2, heads, s.kv_heads, AttentionScale(head_dim())),
        PagePoolView{base.data(), s.dtype, s.page_size, s.head_dim}, PagePoolView{}, &om);
  }
  ExpectClose(out, 1e-4, 1e-5, "sparse decode attention");
}

std::string KvParamName(const ::testing::TestParamInfo<std::tuple<DType, int, int>>& info) {
  return std::string(DTypeName(std::get<0>(info.param))) + "_d" +
         std::to_string(std::get<1>(info.param)) + "_g" + std::to_string(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    DtypesHeadDimsGroups, CudaKvTest,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                       ::testing::Values(32, 64, 96, 128, 256), ::testing::Values(1, 4, 12)),
    KvParamName);

// Lists long enough that a warp of the decode kernel takes more than 32 pages (its window of
// page addresses, one per lane, refills), in a batch wide enough that no list is split: 400
// decode rows over the same 300-page sequence, each row with its own query, dense and sparse
// (whose lists cut a page short now and then, differently per row). 400 rows x 2 KV heads are
// more blocks than any GPU holds at once; even cut in two, a list gives each warp 37 pages.
class CudaLongListTest : public CudaKvTest {};

TEST_P(CudaLongListTest, UnsplitListsLongerThanAWarpsWindowMatchTheCpu) {
  constexpr int32_t kRows = 400, kTokens = 4800;
  std::vector<std::vector<int32_t>> tables;
  KvSetup s = Write({kTokens}, &tables);
  const std::vector<int32_t>& table = tables[0];
  DenseBatch dense;
  PageLists lists;
  for (int32_t row = 0; row < kRows; ++row) {
    dense.Add(1, kTokens - row % 16, table);
    for (int h = 0; h < s.kv_heads; ++h) {
      std::vector<int32_t> pages, tokens;
      for (size_t i = 0; i < table.size(); ++i) {
        pages.push_back(table[i] * s.kv_heads + h);
        const size_t mix = i + static_cast<size_t>(row);
        tokens.push_back(mix % 7 == 3 ? 1 + static_cast<int32_t>(mix % s.page_size) : s.page_size);
      }
      lists.Add(pages, tokens);
    }
  }
  const int heads = s.kv_heads * group();
  const int64_t width = static_cast<int64_t>(heads) * head_dim();
  Twin q = Make(RandomVector(kRows * width, 8));
  Twin dense_out = Zeros(kRows * width * 4), sparse_out = Zeros(kRows * width * 4);
  for (int i = 0; i < 2; ++i) {
    const DeviceBuffer& base = i == 0 ? s.pages.cpu : s.pages.gpu;
    const Mat qm = Of(i == 0 ? q.cpu : q.gpu, kRows, width);
    Mat dm = Of(i == 0 ? dense_out.cpu : dense_out.gpu, kRows, width);
    side(i).PagedAttention(qm, dense.Batch(data(i), heads, AttentionScale(head_dim())),
                           s.View(base), &dm);
    Mat sm = Of(i == 0 ? sparse_out.cpu : sparse_out.gpu, kRows, width);
    side(i).SparseDecodeAttention(
        qm, lists.Batch(data(i), kRows, heads, s.kv_heads, AttentionScale(head_dim())),
        PagePoolView{base.data(), s.dtype, s.page_size, s.head_dim}, PagePoolView{}, &sm);
  }
  ExpectClose(dense_out, 1e-4, 1e-5, "dense attention over long lists");
  ExpectClose(sparse_out, 1e-4, 1e-5, "sparse attention over long lists");
}

INSTANTIATE_TEST_SUITE_P(LongLists, CudaLongListTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values(64, 128), ::testing::Values(4)),
                         KvParamName);

// Recorded operations (a CUDA graph) replay with the memory's current contents, as many times as
// asked, and refuse to replay once the GEMM input buffer they were recorded with has moved (a
// larger GEMM grew it): then nothing runs and the caller records again.
TEST_F(CudaBackendTest, RecordedOpsReplayUntilTheirBuffersMove) {
  constexpr int64_t kIn = 64, kOut = 32, kBig = 512;
  ASSERT_TRUE(gpu_->can_record());
  EXPECT_FALSE(cpu_.can_record());
  const std::vector<float> w = RoundedToBf16(RandomVector(kOut * kIn, 40));
  Weight cw = cpu_.UploadWeight(w.data(), kOut, kIn).value();
  Weight gw = gpu_->UploadWeight(w.data(), kOut, kIn).value();
  Twin x = Make(RandomVector(2 * kIn, 41));
  Twin y = Zeros(2 * kOut * 4);
  Mat gx = Of(x.gpu, 2, kIn), gy = Of(y.gpu, 2, kOut);
  gpu_->Gemm(gx, gw, Weight{}, &gy);  // run once first, as the runner does before recording
  std::unique_ptr<RecordedOps> ops = gpu_->Record([&] { gpu_->Gemm(gx, gw, Weight{}, &gy); });
  ASSERT_NE(ops, nullptr);
  for (uint32_t seed : {42u, 43u}) {  // new inputs, then the recording: y follows them
    const std::vector<float> input = RandomVector(2 * kIn, seed);
    std::memcpy(x.cpu.data(), input.data(), input.size() * 4);
    gpu_->CopyToDevice(x.gpu.data(), input.data(), input.size() * 4);
    ASSERT_TRUE(ops->Replay());
    Mat cy = Of(y.cpu, 2, kOut);
    cpu_.Gemm(Of(x.cpu, 2, kIn), cw, Weight{}, &cy);
    ExpectClose(y, 0.0, 0.1, absl::StrCat("replayed GEMM, inputs ", seed));
  }
  Twin big_x = Make(RandomVector(kBig * kIn, 44));
  Twin big_y = Zeros(kBig * kOut * 4);
  Mat bx = Of(big_x.gpu, kBig, kIn), by = Of(big_y.gpu, kBig, kOut);
  gpu_->Gemm(bx, gw, Weight{}, &by);  // grows the GEMM input buffer
  const std::vector<float> before = ReadGpu(y);
  gpu_->Memset(y.gpu.data(), 0, y.bytes);
  EXPECT_FALSE(ops->Replay());
  EXPECT_EQ(ReadGpu(y), std::vector<float>(before.size(), 0.0f)) << "a refused replay ran";
}

// The tensor-core tile kernel (prefill chunks of >= 16 rows, bf16/f16 KV, head_dim 64/128) rounds
// Q and the softmax weights to the KV dtype before each product, as flash kernels do: its error
// against the CPU's fp32 is that rounding's, bounded here per (row, head) and over the whole
// output. Output starts as NaN, so a row the kernel skips fails.
class CudaTileAttentionTest : public CudaKvTest {
 protected:
  void ExpectRelativeError(const Twin& t, int64_t rows, int heads, double per_head, double whole) {
    const std::vector<float> g = ReadGpu(t), c = ReadCpu(t);
    double diff_all = 0, norm_all = 0;
    int reported = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int h = 0; h < heads; ++h) {
        double diff = 0, norm = 0;
        for (int d = 0; d < head_dim(); ++d) {
          const size_t i = (r * heads + h) * head_dim() + d;
          diff += (static_cast<double>(g[i]) - c[i]) * (static_cast<double>(g[i]) - c[i]);
          norm += static_cast<double>(c[i]) * c[i];
        }
        diff_all += diff;
        norm_all += norm;
        const double rel = std::sqrt(diff / norm);
        if (!(rel <= per_head) && reported++ < 5) {
          ADD_FAILURE() << "row " << r << " head " << h << ": relative error " << rel;
        }
      }
    }
    const double rel = std::sqrt(diff_all / norm_all);
    EXPECT_LE(rel, whole) << "relative error of the whole output";
  }

  // Attends the sequences, given as (chunk rows, keys), on both backends and bounds the error.
  void ExpectTileAttentionMatchesTheCpu(const std::vector<std::pair<int, int>>& seqs) {
    std::vector<int> lens;
    for (const auto& [rows, keys] : seqs) lens.push_back(keys);
    std::vector<std::vector<int32_t>> tables;
    KvSetup s = Write(lens, &tables);
    DenseBatch dense;
    for (size_t i = 0; i < seqs.size(); ++i) dense.Add(seqs[i].first, seqs[i].second, tables[i]);
    const int heads = s.kv_heads * group();
    const int64_t width = static_cast<int64_t>(heads) * head_dim();
    Twin q = Make(RandomVector(dense.rows * width, 8));
    Twin out = Make(std::vector<float>(dense.rows * width, std::nanf("")));
    for (int i = 0; i < 2; ++i) {
      Mat om = Of(i == 0 ? out.cpu : out.gpu, dense.rows, width);
      side(i).PagedAttention(Of(i == 0 ? q.cpu : q.gpu, dense.rows, width),
                             dense.Batch(data(i), heads, AttentionScale(head_dim())),
                             s.View(i == 0 ? s.pages.cpu : s.pages.gpu), &om);
    }
    // bf16 keeps 8 significant bits, f16 11.
    const double unit = dtype() == DType::kBF16 ? 1.0 / 256 : 1.0 / 2048;
    ExpectRelativeError(out, dense.rows, heads, 8 * unit, 2 * unit);
  }
};

TEST_P(CudaTileAttentionTest, PrefillChunksMatchTheCpuWithinKvDtypeRounding) {
  // Fresh prompts of tile and non-tile lengths, chunks after cached prefixes, a decode row and a
  // short chunk in the same launch. The 1100-row chunk makes the grid large enough for the
  // 128-row tiles at groups 4 and 8 (on GPUs of up to 216 SMs; the H100 and H200 have 132);
  // group 1 takes the 64-row tiles, at head_dim 64 with the keys split in two (the short
  // sequences' second splits empty).
  ExpectTileAttentionMatchesTheCpu(
      {{100, 100}, {64, 101}, {1, 500}, {130, 430}, {17, 17}, {1100, 2100}});
}

TEST_P(CudaTileAttentionTest, OneChunkSplitOverItsKeys) {
  // One 256-row chunk after 4096 cached keys gives 4 row tiles per head, too few blocks for the
  // GPU: the key tiles are split 4 to 17 ways (by group and head size) and merged.
  ExpectTileAttentionMatchesTheCpu({{256, 4352}});
}

INSTANTIATE_TEST_SUITE_P(TileKernel, CudaTileAttentionTest,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kF16),
                                            ::testing::Values(64, 128), ::testing::Values(1, 4, 8)),
                         KvParamName);

// A sequence whose rows sit in the middle of the batch, its query heads a column block of q
// (with the batch's row stride), over one-KV-head pages in pinned host memory read through their
// mapping. Rows outside the sequence must keep what they held.
TEST_F(CudaBackendTest, PagedAttentionOnRowsInTheMiddleOfABatchOverPinnedHostPages) {
  constexpr int kGroup = 4, kHeadDim = 64, kPage = 16, kKv = 50, kBatchRows = 12, kFirst = 5,
                kChunk = 4, kWidth = 2 * kGroup * kHeadDim;
  const size_t page_bytes = 2 * kPage * kHeadDim * sizeof(float);
  const int pages = (kKv + kPage - 1) / kPage;
  DeviceBuffer cpu_pages = cpu_.Allocate(pages * page_bytes).value();
  DeviceBuffer gpu_pages = gpu_->AllocatePinnedHost(pages * page_bytes).value();
  std::vector<int32_t> table(pages), wb, wo;
  std::iota(table.rbegin(), table.rend(), 0);  // pages in reverse
  for (int t = 0; t < kKv; ++t) {
    wb.push_back(table[t / kPage]);
    wo.push_back(t % kPage);
  }
  Twin k = Make(RandomVector(kKv * kHeadDim, 30)), v = Make(RandomVector(kKv * kHeadDim, 31));
  for (int i = 0; i < 2; ++i) {
    side(i).WriteKv(
        Of(i == 0 ? k.cpu : k.gpu, kKv, kHeadDim), Of(i == 0 ? v.cpu : v.gpu, kKv, kHeadDim),
        KvWrite{data(i).Put(wb), data(i).Put(wo)},
        KvLayerView{i == 0 ? cpu_pages.data() : gpu_pages.data(), DType::kF32, 1, kPage, kHeadDim});
  }
  Twin q = Make(RandomVector(kBatchRows * kWidth, 32));
  Twin out = Make(RandomVector(kBatchRows * kWidth, 33));  // poison: rows outside must survive
  DenseBatch dense;
  dense.Add(kChunk, kKv, table);
  for (int i = 0; i < 2; ++i) {
    const int64_t col = kGroup * kHeadDim;  // the second KV head's query heads
    Mat om = Of(i == 0 ? out.cpu : out.gpu, kBatchRows, kWidth).Cols(col, col);
    side(i).PagedAttention(
        Of(i == 0 ? q.cpu : q.gpu, kBatchRows, kWidth).Cols(col, col),
        dense.Batch(data(i), kGroup, AttentionScale(kHeadDim), kFirst),
        KvLayerView{i == 0 ? cpu_pages.data() : gpu_pages.data(), DType::kF32, 1, kPage, kHeadDim},
        &om);
  }
  ExpectClose(out, 1e-4, 1e-5, "paged attention on a column block over pinned pages");
}

// A list long enough that the kernel splits it (split-K), mixing device pages with pages of the
// host store read through their mapping (HostPageRef: miss_policy fetch).
TEST_F(CudaBackendTest, LongListsMixingDeviceAndHostPages) {
  constexpr int kKvHeads = 2, kHeadDim = 32, kPage = 16, kPoolPages = 64, kListPages = 20000;
  std::vector<float> kv = RandomVector(kPoolPages * 2 * kPage * kHeadDim, 40);
  Twin pool = Make(kv);
  DeviceBuffer gpu_host = gpu_->AllocatePinnedHost(kv.size() * 4).value();
  std::memcpy(gpu_host.data(), kv.data(), kv.size() * 4);
  PageLists lists;
  std::mt19937 rng(41);
  for (int h = 0; h < kKvHeads; ++h) {
    std::vector<int32_t> pages, tokens;
    for (int i = 0; i < kListPages; ++i) {
      const auto page = static_cast<int32_t>(rng() % kPoolPages);
      pages.push_back(i % 3 == 0 ? HostPageRef(page) : page);
      tokens.push_back(1 + static_cast<int32_t>(rng() % kPage));
    }
    lists.Add(pages, tokens);
  }
  const int heads = 2 * kKvHeads;
  Twin q = Make(RandomVector(heads * kHeadDim, 42));
  Twin out = Zeros(heads * kHeadDim * 4);
  for (int i = 0; i < 2; ++i) {
    const DeviceBuffer& base = i == 0 ? pool.cpu : pool.gpu;
    // On the CPU the host pool is the same memory as the device pool.
    void* host_base = i == 0 ? pool.cpu.data() : gpu_host.data();
    Mat om = Of(i == 0 ? out.cpu : out.gpu, 1, heads * kHeadDim);
    side(i).SparseDecodeAttention(
        Of(i == 0 ? q.cpu : q.gpu, 1, heads * kHeadDim),
        lists.Batch(data(i), 1, heads, kKvHeads, AttentionScale(kHeadDim)),
        PagePoolView{base.data(), DType::kF32, kPage, kHeadDim},
        PagePoolView{host_base, DType::kF32, kPage, kHeadDim}, &om);
  }
  ExpectClose(out, 1e-4, 1e-5, "sparse attention over a long mixed list");
}

// Pages travel pinned host -> device on a copy stream, the compute stream waits on its event and
// copies them back: what arrives is what was sent, and each readback is one counted sync.
TEST_F(CudaBackendTest, CopyStreamGatherIsOrderedByItsEvent) {
  constexpr size_t kPage = 8192, kPages = 64;
  DeviceBuffer host = gpu_->AllocatePinnedHost(kPages * kPage).value();
  DeviceBuffer back = gpu_->AllocatePinnedHost(kPages * kPage).value();
  DeviceBuffer slots = gpu_->Allocate(kPages * kPage).value();
  std::mt19937 rng(3);
  for (size_t i = 0; i < kPages * kPage; ++i) host.as<char>()[i] = static_cast<char>(rng());
  std::vector<PageCopy> in, out;
  for (size_t p = 0; p < kPages; ++p) {
    const size_t slot = (p * 37) % kPages;  // a permutation: a gather, not one block copy
    in.push_back({slots.as<char>() + slot * kPage, host.as<char>() + p * kPage});
    out.push_back({back.as<char>() + p * kPage, slots.as<char>() + slot * kPage});
  }
  std::unique_ptr<Stream> copy = gpu_->CreateStream();
  copy->CopyPages(in, kPage);
  std::shared_ptr<Event> landed = copy->Record();
  gpu_->compute_stream().Wait(landed);
  gpu_->compute_stream().CopyPages(out, kPage);
  const int64_t syncs = gpu_->counters().host_syncs;
  gpu_->Synchronize();
  EXPECT_EQ(gpu_->counters().host_syncs, syncs + 1);
  EXPECT_TRUE(landed->Done());
  EXPECT_EQ(std::memcmp(host.data(), back.data(), kPages * kPage), 0);
}

// The decode stall on a GPU (PagePrefetcher::TakeStallSeconds): the compute stream's timed events
// around its wait for a copy measure how long it stood still: from reaching the wait to the copy
// landing (the copy stream's event, read across streams), milliseconds for 256 MiB; a wait for a
// landed copy costs ~0 (the host's time between two calls, at most).
TEST_F(CudaBackendTest, TimedEventsMeasureTheComputeStreamsWaitForACopy) {
  constexpr size_t kPage = 1 << 20, kPages = 256;  // 256 MiB: milliseconds over the bus
  DeviceBuffer host = gpu_->AllocatePinnedHost(kPages * kPage).value();
  DeviceBuffer slots = gpu_->Allocate(kPages * kPage).value();
  std::vector<PageCopy> in;
  for (size_t p = 0; p < kPages; ++p) {
    in.push_back({slots.as<char>() + p * kPage, host.as<char>() + p * kPage});
  }
  std::unique_ptr<Stream> copy = gpu_->CreateStream();
  Stream& compute = gpu_->compute_stream();
  gpu_->Synchronize();
  const std::shared_ptr<Event> copy_start = copy->RecordTimed();
  copy->CopyPages(in, kPage);
  const std::shared_ptr<Event> landed = copy->RecordTimed();
  const std::shared_ptr<Event> before = compute.RecordTimed();
  compute.Wait(landed);
  const std::shared_ptr<Event> after = compute.RecordTimed();
  gpu_->Synchronize();
  const double copy_seconds = landed->SecondsSince(*copy_start).value();
  const double stall = after->SecondsSince(*before).value();
  EXPECT_GT(copy_seconds, 1e-3);
  EXPECT_GT(stall, 1e-3);
  EXPECT_LE(stall, copy_seconds);
  EXPECT_NEAR(stall, landed->SecondsSince(*before).value(), 100e-6);

  const std::shared_ptr<Event> again = compute.RecordTimed();
  compute.Wait(landed);
  const std::shared_ptr<Event> done = compute.RecordTimed();
  gpu_->Synchronize();
  EXPECT_LT(done->SecondsSince(*again).value(), 0.5e-3);
}

// Weights reach the GPU without an fp32 host copy: each checkpoint tensor is converted in pinned
// staging. A small staging budget makes a weight take many chunks through both alternating
// buffers; a default one fills a large chunk on several threads. Matrices arrive as bf16 of the
// stored values, vectors as fp32, bit for bit.
TEST_F(CudaBackendTest, WeightUploaderStagesMixedDtypesInChunks) {
  for (const auto& [staging, rows_per_part] :
       {std::pair<size_t, int64_t>{64 << 10, 97},
        std::pair<size_t, int64_t>{kWeightStagingBytes, 9000}}) {
    constexpr int64_t kIn = 384;
    const StoredParts stored =
        MakeStoredParts({DType::kBF16, DType::kF32, DType::kF16}, rows_per_part * kIn, 50);
    const int64_t n = static_cast<int64_t>(stored.values.size());
    std::vector<uint16_t> want_bf16(n);
    ConvertFromF32(DType::kBF16, stored.values.data(), want_bf16.data(), n);

    auto uploader = gpu_->CreateWeightUploader(staging);
    Weight matrix = uploader->Upload(stored.parts, 3 * rows_per_part, kIn).value();
    Weight vector = uploader->Upload(stored.parts, 1, n).value();
    uploader.reset();  // waits for the staged copies
    ASSERT_EQ(matrix.dtype, DType::kBF16);
    ASSERT_EQ(vector.dtype, DType::kF32);
    std::vector<uint16_t> got_bf16(n);
    gpu_->CopyToHost(got_bf16.data(), matrix.buffer.data(), n * sizeof(uint16_t));
    EXPECT_EQ(got_bf16, want_bf16) << "staging " << staging;
    std::vector<float> got_f32(n);
    gpu_->CopyToHost(got_f32.data(), vector.buffer.data(), n * sizeof(float));
    EXPECT_EQ(got_f32, stored.values) << "staging " << staging;
  }
}

}  // namespace
}  // namespace specula
