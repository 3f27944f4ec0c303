// Drives a SparseKvCache without a model: the test decides every key, value and query, so the
// pages each step needs are known exactly.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/kv/kv_pool.h"
#include "engine/kv/sparse_kv_cache.h"
#include "gtest/gtest.h"

namespace specula::testing {

struct HarnessShape {
  int32_t layers = 1;
  int32_t heads = 2;
  int32_t kv_heads = 1;
  int32_t head_dim = 64;
  int32_t page_size = 4;
  int32_t device_blocks = 2048;
};

// K and V rows of one token: fills k[head_dim] and v[head_dim].
using KvFn = std::function<void(int64_t tag, int32_t layer, int32_t head, int32_t pos, float* k,
                                float* v)>;

class SparseHarness {
 public:
  // `backend` (default: a one-thread CpuBackend) lets a test change how pages are copied.
  SparseHarness(const SparseOptions& options, const HarnessShape& shape, KvFn kv,
                std::unique_ptr<CpuBackend> backend = nullptr)
      : shape_(shape),
        kv_(std::move(kv)),
        backend_(backend ? std::move(backend) : std::make_unique<CpuBackend>(1)) {
    KvPoolOptions p;
    p.num_layers = shape.layers;
    p.num_kv_heads = shape.kv_heads;
    p.head_dim = shape.head_dim;
    p.page_size = shape.page_size;
    p.num_blocks = shape.device_blocks;
    pool_ = KvPool::Create(*backend_, p).value();
    SparseModelShape m{shape.layers, shape.heads, shape.kv_heads, shape.head_dim};
    cache_ = SparseKvCache::Create(options, m, *backend_, pool_).value();
  }

  SparseKvCache& cache() { return *cache_; }
  KvPool& pool() { return pool_; }
  const HarnessShape& shape() const { return shape_; }

  // Admits a sequence and prefills `prompt` tokens; `last_query` (heads * head_dim, may be
  // empty = zeros) is the last prompt row's query, which cross_step uses as a prediction.
  std::shared_ptr<WorkingSet> Start(int64_t tag, int32_t prompt, int32_t max_new,
                                    int64_t budget_tokens,
                                    const std::vector<float>& last_query = {}) {
    auto ws = cache_->Admit(prompt + max_new, budget_tokens, prompt).value();
    tags_[ws.get()] = tag;
    pos_[ws.get()] = prompt;
    const int32_t qw = shape_.heads * shape_.head_dim, kw = shape_.kv_heads * shape_.head_dim;
    std::vector<float> q(static_cast<size_t>(prompt) * qw, 0.0f), k(prompt * kw), v(prompt * kw),
        out(prompt * qw);
    if (!last_query.empty()) std::copy(last_query.begin(), last_query.end(), q.end() - qw);
    SparseRows r{ws.get(), 0, prompt, 0, true};
    for (int32_t l = 0; l < shape_.layers; ++l) {
      FillKv(tag, l, 0, prompt, k.data(), v.data());
      Mat qm(q.data(), prompt, qw), km(k.data(), prompt, kw), vm(v.data(), prompt, kw),
          om(out.data(), prompt, qw);
      cache_->Prefill(l, absl::MakeConstSpan(&r, 1), qm, km, vm, &om);
    }
    return ws;
  }

  // One decode step for `seqs` (each with its query, heads * head_dim, the same at every layer)
  // through every layer; `before_layer(l)` runs before layer l (predictions).
  void Step(const std::vector<WorkingSet*>& seqs, const std::vector<std::vector<float>>& queries,
            std::function<void(int32_t layer)> before_layer = nullptr) {
    const int32_t n = static_cast<int32_t>(seqs.size());
    const int32_t qw = shape_.heads * shape_.head_dim, kw = shape_.kv_heads * shape_.head_dim;
    std::vector<float> q(static_cast<size_t>(n) * qw), k(n * kw), v(n * kw), out(n * qw);
    std::vector<SparseRows> rows;
    for (int32_t i = 0; i < n; ++i) {
      rows.push_back({seqs[i], i, 1, pos_[seqs[i]], false});
      std::copy(queries[i].begin(), queries[i].end(), q.begin() + i * qw);
    }
    cache_->BeginDecodeStep(rows);
    for (int32_t l = 0; l < shape_.layers; ++l) {
      if (before_layer) before_layer(l);
      for (int32_t i = 0; i < n; ++i) {
        FillKv(tags_[seqs[i]], l, pos_[seqs[i]], 1, k.data() + i * kw, v.data() + i * kw);
      }
      Mat qm(q.data(), n, qw), km(k.data(), n, kw), vm(v.data(), n, kw), om(out.data(), n, qw);
      cache_->Decode(l, rows, qm, km, vm, &om);
    }
    for (WorkingSet* ws : seqs) ++pos_[ws];
    last_out_ = std::move(out);
  }

  void Finish(WorkingSet& ws) {
    tags_.erase(&ws);
    pos_.erase(&ws);
    cache_->Release(ws);
  }
  int32_t position(const WorkingSet* ws) const { return pos_.at(ws); }
  int64_t tag(const WorkingSet* ws) const { return tags_.at(ws); }
  const std::vector<float>& last_out() const { return last_out_; }

  // The K/V rows the cache must hold for (ws, layer, head, pos).
  void Expected(const WorkingSet* ws, int32_t layer, int32_t head, int32_t pos, float* k,
                float* v) const {
    kv_(tags_.at(ws), layer, head, pos, k, v);
  }

 private:
  void FillKv(int64_t tag, int32_t layer, int32_t first, int32_t n, float* k, float* v) {
    const int32_t hd = shape_.head_dim, kw = shape_.kv_heads * hd;
    for (int32_t t = 0; t < n; ++t) {
      for (int32_t h = 0; h < shape_.kv_heads; ++h) {
        kv_(tag, layer, h, first + t, k + t * kw + h * hd, v + t * kw + h * hd);
      }
    }
  }

  HarnessShape shape_;
  KvFn kv_;
  std::unique_ptr<CpuBackend> backend_;
  KvPool pool_;
  std::unique_ptr<SparseKvCache> cache_;
  std::map<const WorkingSet*, int64_t> tags_;
  std::map<const WorkingSet*, int32_t> pos_;
  std::vector<float> last_out_;
};

}  // namespace specula::testing
