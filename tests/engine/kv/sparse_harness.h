// Drives a SparseKvCache without a model: the test decides every key, value and query, so the
// pages each step needs are known exactly. A sequence's prompt K/V is written into its host
// pages directly and made ready for decode as a layer-major prefill would (DecodeStart); each
// step then runs the decode seam (SparseDecodeKv) layer by layer on the test's queries.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "engine/backend/step_plan.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/kv/decode_start.h"
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
  int64_t host_tokens = 4096;  // the host store's capacity per layer and KV head
};

// K and V rows of one token: fills k[head_dim] and v[head_dim].
using KvFn =
    std::function<void(int64_t tag, int32_t layer, int32_t head, int32_t pos, float* k, float* v)>;

class SparseHarness {
 public:
  // `backend` (default: a one-thread CpuBackend) lets a test change how pages are copied.
  SparseHarness(const SparseOptions& options, const HarnessShape& shape, KvFn kv,
                std::unique_ptr<CpuBackend> backend = nullptr)
      : shape_(shape),
        kv_(std::move(kv)),
        backend_(backend ? std::move(backend) : std::make_unique<CpuBackend>(1)),
        plan_(*backend_) {
    KvPoolOptions p;
    p.num_layers = shape.layers;
    p.num_kv_heads = shape.kv_heads;
    p.head_dim = shape.head_dim;
    p.page_size = shape.page_size;
    p.num_blocks = shape.device_blocks;
    pool_ = KvPool::Create(*backend_, p).value();
    store_ = HostKvStore::Create(pool_.HostStoreOptions(shape.host_tokens)).value();
    SparseModelShape m{shape.layers, shape.heads, shape.kv_heads, shape.head_dim,
                       AttentionScale(shape.head_dim)};
    cache_ = SparseKvCache::Create(options, m, *backend_, pool_, *store_).value();
  }

  SparseKvCache& cache() { return *cache_; }
  KvPool& pool() { return pool_; }
  CpuBackend& backend() { return *backend_; }
  const HarnessShape& shape() const { return shape_; }
  // What the last step's operations counted, over all sequences.
  const SparseStepStats& last_step() const { return step_; }
  // The stall time of every step so far (the compute stream's waits for prefetch copies).
  double total_stall_seconds() const { return total_stall_seconds_; }

  // Admits a sequence of `prompt` tokens and prefills it; `last_query` (heads * head_dim, may
  // be empty = zeros) is the last prompt row's query, which cross_step uses as a prediction.
  std::shared_ptr<WorkingSet> Start(int64_t tag, int32_t prompt, int32_t max_new,
                                    int64_t budget_tokens,
                                    const std::vector<float>& last_query = {}) {
    auto ws = cache_->Admit(prompt + max_new, budget_tokens, prompt).value();
    tags_[ws.get()] = tag;
    pos_[ws.get()] = prompt;
    const int32_t hd = shape_.head_dim;
    std::vector<float> k(hd), v(hd);
    for (int32_t l = 0; l < shape_.layers; ++l) {
      for (int32_t h = 0; h < shape_.kv_heads; ++h) {
        for (int32_t pos = 0; pos < prompt; ++pos) {
          kv_(tag, l, h, pos, k.data(), v.data());
          cache_->mutable_store().WriteToken(ws->host(), l, h, pos, k.data(), v.data());
        }
      }
    }
    std::vector<float> q(static_cast<size_t>(shape_.heads) * hd, 0.0f);
    if (!last_query.empty()) q = last_query;
    DecodeStart start(*cache_, *ws, prompt, 0);
    std::vector<int32_t> layers;
    for (int32_t l = 0; l < shape_.layers; ++l) layers.push_back(l);
    BeginStep();
    EXPECT_TRUE(start.Plan(layers, plan_).ok());
    EXPECT_TRUE(plan_.Upload().ok());
    start.Bind(plan_);
    for (int32_t l = 0; l < shape_.layers; ++l) {
      start.Run(l, PromptPages{cache_->store().pool(), /*host_store=*/true},
                Mat(q.data(), 1, static_cast<int64_t>(q.size())));
    }
    start.EndStep();
    EndStep();
    start.FinishStep(&step_);
    ws->window_begin = ws->geometry().window_begin(prompt / shape_.page_size);
    return ws;
  }

  // One decode step for `seqs` (each with its query, heads * head_dim, the same at every layer)
  // through every layer; `before_layer(l)` runs before layer l (predictions: PredictLayer).
  void Step(const std::vector<WorkingSet*>& seqs, const std::vector<std::vector<float>>& queries,
            std::function<void(int32_t layer)> before_layer = nullptr) {
    const int32_t n = static_cast<int32_t>(seqs.size());
    const int32_t qw = shape_.heads * shape_.head_dim, kw = shape_.kv_heads * shape_.head_dim;
    std::vector<float> q(static_cast<size_t>(n) * qw), k(n * kw), v(n * kw), out(n * qw);
    std::vector<SparseDecodeRow> rows;
    for (int32_t i = 0; i < n; ++i) {
      rows.push_back({seqs[i], i, pos_[seqs[i]]});
      std::copy(queries[i].begin(), queries[i].end(), q.begin() + i * qw);
    }
    BeginStep();
    EXPECT_TRUE(cache_->decode().Plan(rows, plan_).ok());
    EXPECT_TRUE(plan_.Upload().ok());
    cache_->decode().Bind(plan_);
    for (int32_t l = 0; l < shape_.layers; ++l) {
      if (before_layer) before_layer(l);
      for (int32_t i = 0; i < n; ++i) {
        FillKv(tags_[seqs[i]], l, pos_[seqs[i]], 1, k.data() + i * kw, v.data() + i * kw);
      }
      Mat qm(q.data(), n, qw), km(k.data(), n, kw), vm(v.data(), n, kw), om(out.data(), n, qw);
      cache_->decode().Attend(l, qm, km, vm, &om);
    }
    EndStep();
    for (WorkingSet* ws : seqs) ++pos_[ws];
    last_out_ = std::move(out);
  }

  // Cross-layer prediction of `layer`'s pages for the step running, from `queries` (one per
  // sequence of the step, heads * head_dim): call from Step's before_layer.
  void PredictLayer(int32_t layer, const std::vector<std::vector<float>>& queries) {
    std::vector<float> q;
    for (const auto& row : queries) q.insert(q.end(), row.begin(), row.end());
    cache_->decode().PredictLayer(
        layer, Mat(q.data(), static_cast<int64_t>(queries.size()), shape_.heads * shape_.head_dim));
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

  // The page index within its sequence of attend-list entry `e` of (row, head), for a row at
  // position `pos` (what the observer sees; the device state is readable on the CPU).
  int32_t Logical(const AttendedPages& a, int32_t row, int32_t head, int32_t e) const {
    const WorkingSet& ws = *a.rows[row];
    const WorkingSetGeometry& g = ws.geometry();
    const int32_t ref = a.pages[e];
    if (IsHostPageRef(ref)) {
      const absl::Span<const PageId> pages = ws.host().pages(a.layer, head);
      const auto it = std::find(pages.begin(), pages.end(), HostPageOf(ref));
      EXPECT_NE(it, pages.end()) << "a host page of another sequence";
      return static_cast<int32_t>(it - pages.begin());
    }
    const auto& blocks = ws.device_blocks();
    int32_t slot = -1;
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i] * g.kv_heads + head == ref) slot = static_cast<int32_t>(i);
    }
    EXPECT_GE(slot, 0) << "a device page outside the sequence's slots";
    if (slot < g.sink_pages) return slot;
    const int32_t current = a.positions[row] / g.page_size;
    if (slot < g.sink_pages + g.window_pages + 1) {
      for (int32_t p = g.window_begin(current); p <= current; ++p) {
        if (ws.ring_slot(p) == slot) return p;
      }
      ADD_FAILURE() << "a ring slot outside the window";
      return -1;
    }
    const int64_t lh = static_cast<int64_t>(a.layer) * g.kv_heads + head;
    return ws.device().slot_page[lh * g.cache_slots + (slot - g.sink_pages - g.window_pages - 1)];
  }
  // Every entry of (row, head)'s list, as page indices.
  std::vector<int32_t> LogicalList(const AttendedPages& a, int32_t row, int32_t head) const {
    std::vector<int32_t> out;
    const int64_t list = static_cast<int64_t>(row) * shape_.kv_heads + head;
    for (int32_t e = a.list_begin[list]; e < a.list_begin[list] + a.list_count[list]; ++e) {
      out.push_back(Logical(a, row, head, e));
    }
    return out;
  }

 private:
  void BeginStep() {
    plan_.Clear();
    cache_->PlanStep(plan_);
  }
  // The step's end as the generator runs it: readbacks, the one synchronization, the counters.
  void EndStep() {
    cache_->EndStep();
    backend_->Synchronize();
    step_ = SparseStepStats();
    cache_->FinishStep(&step_);
    total_stall_seconds_ += step_.stall_seconds;
  }
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
  std::unique_ptr<HostKvStore> store_;
  std::unique_ptr<SparseKvCache> cache_;  // after store_ (uses it)
  StepPlan plan_;
  SparseStepStats step_;
  double total_stall_seconds_ = 0;
  std::map<const WorkingSet*, int64_t> tags_;
  std::map<const WorkingSet*, int32_t> pos_;
  std::vector<float> last_out_;
};

}  // namespace specula::testing
