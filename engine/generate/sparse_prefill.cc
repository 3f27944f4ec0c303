#include "engine/generate/sparse_prefill.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_format.h"
#include "engine/common/ceil_div.h"
#include "engine/common/check.h"
#include "engine/common/status_macros.h"

namespace specula {

// The KV seam of one unit: the chunk's K/V go into the layer buffer, and its rows attend
// causally to everything before them there.
class SparsePrefill::LayerKv : public KvAttention {
 public:
  explicit LayerKv(SparsePrefill& job) : job_(job) {}
  void set_unit(const Unit* unit) { unit_ = unit; }

  void Attend(int32_t layer, const Mat& q, const Mat& k, const Mat& v, Mat* out) override {
    const Unit& u = *unit_;
    const StepPlan& plan = *job_.plan_;
    if (u.begin == job_.start_ && job_.start_ > 0) {
      // The cached prefix's pages of this layer, for the new chunks to attend to.
      job_.CopyLayerPages(layer, 0, static_cast<int32_t>(job_.start_ / job_.layer_view_.page_size),
                          /*to_host=*/false);
    }
    job_.backend_.WriteKv(k, v, KvWrite{plan.Device(u.write_blocks), plan.Device(u.write_offsets)},
                          job_.layer_view_);
    AttentionBatch batch;
    batch.rows = static_cast<int32_t>(u.end - u.begin);
    batch.row_keys = plan.Device(u.row_keys);
    batch.row_block_begin = plan.Device(u.row_begin);
    batch.blocks = plan.Device(job_.identity_);
    batch.max_keys = static_cast<int32_t>(u.end);
    batch.num_heads = job_.cache_.shape().heads;
    batch.scale = job_.cache_.shape().softmax_scale;
    batch.seq_rows = plan.Device(u.seq_rows);
    batch.seqs = 1;
    batch.max_seq_rows = batch.rows;
    job_.backend_.PagedAttention(q, batch, job_.layer_view_, out);
    if (u.end == job_.prompt_tokens()) job_.EndLayer(layer, q.Rows(batch.rows - 1, 1));
  }

 private:
  SparsePrefill& job_;
  const Unit* unit_ = nullptr;
};

absl::StatusOr<std::unique_ptr<SparsePrefill>> SparsePrefill::Create(
    Transformer& model, SparseKvCache& cache, WorkingSet& ws, std::vector<int32_t> prompt,
    int64_t start, int32_t chunk_tokens) {
  const int32_t ps = cache.page_size();
  CHECK(start % ps == 0 && start < static_cast<int64_t>(prompt.size()))
      << "a cached prefix is whole pages and leaves a token to prefill";
  std::unique_ptr<SparsePrefill> job(
      new SparsePrefill(model, cache, ws, std::move(prompt), start, chunk_tokens));
  const int64_t rows = job->prompt_tokens() - start;
  const size_t hidden_bytes =
      static_cast<size_t>(rows) * model.config().hidden_size * sizeof(float);
  auto fail = [&](const absl::Status& s, const char* what) {
    return absl::Status(s.code(), absl::StrFormat("sparse prefill of a %d-token prompt: %s: %s",
                                                  job->prompt_tokens(), what, s.message()));
  };
  absl::StatusOr<DeviceBuffer> hidden = job->backend_.Allocate(hidden_bytes);
  if (!hidden.ok()) return fail(hidden.status(), "hidden states");
  job->hidden_ = std::move(*hidden);
  const KvLayerView pool = cache.device().Layer(0);
  job->layer_view_ = KvLayerView{nullptr, pool.dtype, pool.num_kv_heads, ps, pool.head_dim};
  absl::StatusOr<DeviceBuffer> kv = job->backend_.Allocate(static_cast<size_t>(job->pages_) *
                                                           pool.num_kv_heads * pool.page_bytes());
  if (!kv.ok()) return fail(kv.status(), "one layer's KV");
  job->layer_kv_ = std::move(*kv);
  job->layer_view_.base = job->layer_kv_.data();
  return job;
}

SparsePrefill::SparsePrefill(Transformer& model, SparseKvCache& cache, WorkingSet& ws,
                             std::vector<int32_t> prompt, int64_t start, int32_t chunk_tokens)
    : model_(model),
      cache_(cache),
      backend_(cache.backend()),
      ws_(ws),
      prompt_(std::move(prompt)),
      start_(start),
      chunk_tokens_(chunk_tokens),
      layers_(cache.shape().layers),
      pages_(
          static_cast<int32_t>(CeilDiv(static_cast<int64_t>(prompt_.size()), cache.page_size()))),
      next_begin_(start),
      attention_(std::make_unique<LayerKv>(*this)),
      decode_start_(cache, ws, static_cast<int64_t>(prompt_.size()), start) {}

SparsePrefill::~SparsePrefill() = default;

absl::Status SparsePrefill::Plan(int64_t layer_tokens, StepPlan& plan) {
  CHECK(!done());
  plan_ = &plan;
  units_.clear();
  finishes_ = false;
  std::vector<int32_t> ending;
  const int32_t ps = cache_.page_size();
  identity_ = plan.Reserve<int32_t>(pages_);
  std::iota(plan.Host(identity_), plan.Host(identity_) + pages_, 0);
  int64_t budget = std::max<int64_t>(layer_tokens, 1);
  while (budget > 0 && !done()) {
    Unit u;
    u.layer = next_layer_;
    u.begin = next_begin_;
    u.end = std::min(u.begin + chunk_tokens_, prompt_tokens());
    const int64_t n = u.end - u.begin;
    if (u.layer == 0) {
      u.tokens = plan.Add<int32_t>(absl::MakeConstSpan(prompt_).subspan(u.begin, n));
    }
    u.positions = plan.Reserve<int32_t>(n);
    u.write_blocks = plan.Reserve<int32_t>(n);
    u.write_offsets = plan.Reserve<int32_t>(n);
    u.row_keys = plan.Reserve<int32_t>(n);
    u.row_begin = plan.Reserve<int32_t>(n);
    for (int64_t i = 0; i < n; ++i) {
      const auto pos = static_cast<int32_t>(u.begin + i);
      plan.Host(u.positions)[i] = pos;
      plan.Host(u.write_blocks)[i] = pos / ps;
      plan.Host(u.write_offsets)[i] = pos % ps;
      plan.Host(u.row_keys)[i] = pos + 1;
      plan.Host(u.row_begin)[i] = 0;
    }
    const int32_t seq_rows[] = {0, static_cast<int32_t>(n)};  // the chunk is one sequence
    u.seq_rows = plan.Add<int32_t>(seq_rows);
    units_.push_back(u);
    budget -= n;
    next_begin_ = u.end;
    if (u.end == prompt_tokens()) {
      ending.push_back(u.layer);
      ++next_layer_;
      next_begin_ = start_;
    }
  }
  finishes_ = done();
  if (finishes_) {
    const int32_t last = static_cast<int32_t>(prompt_tokens() - start_ - 1);
    last_row_ = plan.Add<int32_t>(absl::MakeConstSpan(&last, 1));
  }
  return decode_start_.Plan(ending, plan);
}

void SparsePrefill::Bind(const StepPlan& plan) {
  plan_ = &plan;
  decode_start_.Bind(plan);
}

void SparsePrefill::Run(int64_t logit_row) {
  const int64_t hidden = model_.config().hidden_size;
  Mat all(hidden_.as<float>(), prompt_tokens() - start_, hidden);
  for (const Unit& u : units_) {
    Mat x = all.Rows(u.begin - start_, u.end - u.begin);
    if (u.layer == 0) model_.Embed(plan_->Device(u.tokens), &x);
    attention_->set_unit(&u);
    model_.ForwardLayer(u.layer, &x, plan_->Device(u.positions), *attention_);
  }
  if (finishes_) {
    model_.Logits(all, plan_->Device(last_row_), logit_row);
    const WorkingSetGeometry& g = ws_.geometry();
    ws_.window_begin = g.window_begin(static_cast<int32_t>(prompt_tokens() / g.page_size));
  }
}

void SparsePrefill::CopyLayerPages(int32_t layer, int32_t first_page, int32_t end_page,
                                   bool to_host) {
  const int32_t kv_heads = ws_.geometry().kv_heads;
  HostKvStore& store = cache_.mutable_store();
  const PagePoolView buffer = PagesOf(layer_view_);
  std::vector<PageCopy> copies;
  copies.reserve(static_cast<size_t>(std::max(0, end_page - first_page)) * kv_heads);
  for (int32_t p = first_page; p < end_page; ++p) {
    for (int32_t h = 0; h < kv_heads; ++h) {
      void* host = store.Page(ws_.host().page(layer, h, p));
      void* dev = buffer.page(static_cast<int64_t>(p) * kv_heads + h);
      copies.push_back(to_host ? PageCopy{host, dev} : PageCopy{dev, host});
    }
  }
  if (!copies.empty()) backend_.compute_stream().CopyPages(copies, store.page_bytes());
}

void SparsePrefill::EndLayer(int32_t layer, const Mat& last_query) {
  // The new pages (the last one possibly partial: decode completes it) go to the host store once.
  CopyLayerPages(layer, static_cast<int32_t>(start_ / cache_.page_size()), pages_,
                 /*to_host=*/true);
  decode_start_.Run(layer, PromptPages{PagesOf(layer_view_), /*host_store=*/false}, last_query);
}

void SparsePrefill::FinishStep(SparseStepStats* step) { decode_start_.FinishStep(step); }

}  // namespace specula
