#include "tools/bench/decode_gemm_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/common/ceil_div.h"
#include "tools/bench/random_values.h"
#include "tools/bench/serve_stats.h"

namespace specula {
namespace {

// Weights touched per timed pass: five times an H100's L2, so no pass finds them there.
constexpr int64_t kBytesTouched = int64_t{256} << 20;

struct ModelShape {
  const char* name;
  int64_t hidden, kv, intermediate, vocab;
};
constexpr ModelShape kModels[] = {{"1b", 2048, 512, 8192, 128256},
                                  {"8b", 4096, 1024, 14336, 128256}};

const ModelShape* FindModel(const std::string& name) {
  for (const ModelShape& m : kModels) {
    if (name == m.name) return &m;
  }
  return nullptr;
}

struct Projection {
  const char* name;
  int64_t in, out;
  int64_t bytes() const { return in * out * 2; }  // bf16
};

// The projections of one layer (qkv, o, gate_up, down), then the LM head.
std::vector<Projection> ProjectionsOf(const ModelShape& m) {
  return {{"qkv", m.hidden, m.hidden + 2 * m.kv},
          {"o", m.hidden, m.hidden},
          {"gate_up", m.hidden, 2 * m.intermediate},
          {"down", m.intermediate, m.hidden},
          {"lm_head", m.hidden, m.vocab}};
}

// Small values, so a layer chain replayed many times stays finite.
constexpr float kValueScale = 1.0f / 64;

// `copies` uploads of a projection's weights (the same values: only the addresses matter).
absl::StatusOr<std::vector<Weight>> Upload(Backend& b, const Projection& p, int64_t copies) {
  const std::vector<float> values = RandomValues(static_cast<size_t>(p.in * p.out), 7, kValueScale);
  std::vector<Weight> weights;
  for (int64_t i = 0; i < copies; ++i) {
    auto w = b.UploadWeight(values.data(), p.out, p.in);
    if (!w.ok()) return w.status();
    weights.push_back(std::move(*w));
  }
  b.Synchronize();
  return weights;
}

// Activations of `rows` rows in backend memory: kSlots matrices, each wide enough for any
// projection of the model.
constexpr int kSlots = 6;
struct Activations {
  DeviceBuffer buffer;
  int64_t rows = 0, width = 0;
  Mat Slot(int i, int64_t cols) const {
    return Mat(static_cast<float*>(buffer.data()) + i * rows * width, rows, cols, width);
  }
};

absl::StatusOr<Activations> MakeActivations(Backend& b, const ModelShape& m, int rows) {
  Activations a;
  a.rows = rows;
  a.width = std::max(2 * m.intermediate, m.vocab);
  const std::vector<float> values =
      RandomValues(static_cast<size_t>(kSlots * a.rows * a.width), 7, kValueScale);
  auto buffer = b.Allocate(values.size() * sizeof(float));
  if (!buffer.ok()) return buffer.status();
  a.buffer = std::move(*buffer);
  b.CopyToDevice(a.buffer.data(), values.data(), values.size() * sizeof(float));
  b.Synchronize();
  return a;
}

// Passes a timed sample runs, so one graph launch and one synchronization (~10-20 us) are a
// small part of it even where a pass is a single GEMM of ~100 us.
constexpr int kPassesPerSample = 10;

struct PassTime {
  double ms = 0;          // median time of one pass
  bool replayed = false;  // from a recording (else as issued)
};

// Times `pass`, recorded and replayed where the backend records. It runs once as issued first,
// as the model runner does before it records a step (kernels configure themselves on first use,
// outside any recording).
PassTime TimePass(Backend& b, const std::function<void()>& pass, int repeats) {
  pass();
  b.Synchronize();
  std::unique_ptr<RecordedOps> recorded = b.can_record() ? b.Record(pass) : nullptr;
  PassTime t;
  t.replayed = recorded != nullptr;
  auto run = [&] {
    if (recorded == nullptr || !recorded->Replay()) {
      t.replayed = false;
      pass();
    }
  };
  run();  // warm-up of the replay
  b.Synchronize();
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < kPassesPerSample; ++k) run();
    b.Synchronize();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
        kPassesPerSample);
  }
  t.ms = Median(std::move(ms));
  return t;
}

// in and out are 0 for a chain of several GEMMs; `calls` GEMMs (or layers) make one pass.
void PrintRow(const char* model, int64_t rows, const char* what, int64_t in, int64_t out,
              int64_t bytes, int64_t calls, const PassTime& t) {
  auto size = [](int64_t n) { return n == 0 ? std::string("—") : std::to_string(n); };
  const double us = t.ms * 1e3 / calls;
  std::printf("| %s | %lld | %s | %s | %s | %.1f | %.2f | %.0f | %s |\n", model,
              static_cast<long long>(rows), what, size(in).c_str(), size(out).c_str(), bytes / 1e6,
              us, bytes / (us * 1e-6) / 1e9, t.replayed ? "yes" : "no");
}

// Each projection's copies back to back (a GEMM's first weight loads may overlap the one before).
absl::Status TimeProjections(Backend& b, const ModelShape& m, const Activations& a, int repeats) {
  for (const Projection& p : ProjectionsOf(m)) {
    const int64_t copies = std::max<int64_t>(1, CeilDiv(kBytesTouched, p.bytes()));
    auto weights = Upload(b, p, copies);
    if (!weights.ok()) return weights.status();
    Mat x = a.Slot(0, p.in), y = a.Slot(1, p.out);
    const PassTime t = TimePass(
        b,
        [&] {
          for (const Weight& w : *weights) b.Gemm(x, w, Weight{}, &y);
        },
        repeats);
    PrintRow(m.name, a.rows, p.name, p.in, p.out, p.bytes(), copies, t);
  }
  return absl::OkStatus();
}

// A layer's GEMMs with the kernels ahead of each, as Transformer::LayerBody runs them at batch 1:
// the input norm with the residual add, qkv; o; the post-attention norm, gate_up; SwiGLU, down.
// Attention itself is left out; in its place (the split combine, a small kernel that makes o's
// input) a SwiGLU over a row of twice the width.
absl::Status TimeLayerChain(Backend& b, const ModelShape& m, const Activations& a, int repeats) {
  const std::vector<Projection> all = ProjectionsOf(m);
  const std::vector<Projection> layer(all.begin(), all.begin() + 4);
  int64_t layer_bytes = 0;
  for (const Projection& p : layer) layer_bytes += p.bytes();
  const int64_t copies = std::max<int64_t>(1, CeilDiv(kBytesTouched, layer_bytes));
  std::vector<std::vector<Weight>> weights;
  for (const Projection& p : layer) {
    auto w = Upload(b, p, copies);
    if (!w.ok()) return w.status();
    weights.push_back(std::move(*w));
  }
  const std::vector<float> norm_values(static_cast<size_t>(m.hidden), 1.0f);
  auto norm = b.UploadWeight(norm_values.data(), 1, m.hidden);
  if (!norm.ok()) return norm.status();
  Mat x = a.Slot(0, m.hidden), h = a.Slot(1, m.hidden), qkv = a.Slot(2, layer[0].out);
  Mat gate_up = a.Slot(3, layer[2].out), act = a.Slot(4, m.intermediate);
  Mat attention_in = a.Slot(3, 2 * m.hidden), attention_out = a.Slot(5, m.hidden);
  const PassTime t = TimePass(
      b,
      [&] {
        for (int64_t c = 0; c < copies; ++c) {
          b.AddRmsNorm(&x, h, *norm, 1e-5f, &h);
          b.Gemm(h, weights[0][c], Weight{}, &qkv);
          b.SwiGlu(attention_in, &attention_out);
          b.Gemm(attention_out, weights[1][c], Weight{}, &h);
          b.AddRmsNorm(&x, h, *norm, 1e-5f, &h);
          b.Gemm(h, weights[2][c], Weight{}, &gate_up);
          b.SwiGlu(gate_up, &act);
          b.Gemm(act, weights[3][c], Weight{}, &h);
        }
      },
      repeats);
  PrintRow(m.name, a.rows, "layer chain", 0, 0, layer_bytes, copies, t);
  return absl::OkStatus();
}

}  // namespace

bool DecodeGemmModelKnown(const std::string& name) { return FindModel(name) != nullptr; }

int RunDecodeGemmTable(Backend& b, const std::vector<std::string>& models,
                       const std::vector<int>& row_counts, int repeats) {
  std::printf(
      "\nDecode GEMMs (us a GEMM, or a layer for the chain): GB/s = weight bytes (bf16) / time\n\n"
      "| model | rows | projection | in | out | weight MB | us | GB/s | graph |\n"
      "|---|---|---|---|---|---|---|---|---|\n");
  for (const std::string& name : models) {
    const ModelShape* m = FindModel(name);
    if (m == nullptr) {
      std::cerr << "specula-bench: --gemm-models: unknown model shape '" << name << "' (1b, 8b)\n";
      return 1;
    }
    for (const int rows : row_counts) {
      auto activations = MakeActivations(b, *m, rows);
      absl::Status status = activations.status();
      if (status.ok()) status = TimeProjections(b, *m, *activations, repeats);
      if (status.ok()) status = TimeLayerChain(b, *m, *activations, repeats);
      if (!status.ok()) {
        std::cerr << "specula-bench: decode GEMMs of " << name << " at " << rows
                  << " rows: " << status << "\n";
        return 1;
      }
    }
  }
  return 0;
}

}  // namespace specula
