#include "engine/kv/sparse_decode.h"

#include <algorithm>
#include <cmath>

#include "engine/common/check.h"
#include "engine/common/status_macros.h"

namespace specula {

SparseDecodeKv::SparseDecodeKv(const SparseOptions& options, const SparseModelShape& shape,
                               Backend& backend, KvPool& device, HostKvStore& store,
                               SelectionIndex& index, PagePrefetcher& prefetcher)
    : options_(options),
      shape_(shape),
      backend_(backend),
      device_(device),
      store_(store),
      index_(index),
      prefetcher_(prefetcher),
      counters_(backend) {}

absl::Status SparseDecodeKv::Plan(absl::Span<const SparseDecodeRow> rows, StepPlan& plan) {
  rows_.assign(rows.begin(), rows.end());
  any_retire_ = any_complete_ = any_scoring_ = false;
  max_candidates_ = max_list_ = 0;
  if (rows_.empty()) return absl::OkStatus();
  const int32_t ps = device_.page_size();
  const int32_t kv_heads = shape_.kv_heads;
  first_row_ = rows_.front().q_row;
  plan_rows_ = plan.Reserve<SparseRowPlan>(rows_.size());
  write_blocks_ = plan.Reserve<int32_t>(rows_.size());
  write_offsets_ = plan.Reserve<int32_t>(rows_.size());
  list_begin_ = plan.Reserve<int32_t>(rows_.size() * kv_heads);
  SparseRowPlan* out = plan.Host(plan_rows_);
  int32_t scores = 0, entries = 0, stride = 0;
  for (size_t i = 0; i < rows_.size(); ++i) {
    const SparseDecodeRow& r = rows_[i];
    WorkingSet& ws = *r.ws;
    const WorkingSetGeometry& g = ws.geometry();
    CHECK_EQ(r.q_row, first_row_ + static_cast<int32_t>(i)) << "sparse decode rows are contiguous";
    CHECK_GE(ws.window_begin, 0) << "decode before the prompt was prefilled";
    CHECK(!ws.needs_init());
    const int32_t current = r.pos / ps;
    const int32_t candidate_end = g.window_begin(current);
    SparseRowPlan& p = out[i];
    p = SparseRowPlan();
    p.seq = ws.device();
    p.q_row = r.q_row;
    p.pos = r.pos;
    p.step = ++ws.decode_step;
    p.retire_begin = ws.window_begin;
    p.retire_end = std::max(ws.window_begin, candidate_end);
    ws.window_begin = p.retire_end;
    p.completes_page = r.pos % ps == ps - 1;
    p.candidates = candidate_end - g.sink_pages;
    p.score_begin = scores;
    p.list_begin = entries;
    p.list_capacity = g.list_capacity();
    p.correct_pages = deferred() ? CorrectedPages(options_.miss_correction, g.budget_pages) : 0;
    scores += kv_heads * p.candidates;
    entries += kv_heads * p.list_capacity;
    for (int32_t h = 0; h < kv_heads; ++h) {
      plan.Host(list_begin_)[i * kv_heads + h] = p.list_begin + h * p.list_capacity;
    }
    plan.Host(write_blocks_)[i] = ws.device_blocks()[ws.write_slot(current)];
    plan.Host(write_offsets_)[i] = r.pos % ps;
    any_retire_ |= p.retire_begin < p.retire_end;
    any_complete_ |= p.completes_page != 0;
    any_scoring_ |= p.candidates > g.budget_pages;
    max_candidates_ = std::max(max_candidates_, p.candidates);
    max_list_ = std::max(max_list_, p.list_capacity);
    stride = std::max(stride, g.cache_slots);
  }
  max_slots_ = std::max(stride, 1);
  scores_ = plan.Scratch<float>(std::max(scores, 1));
  list_pages_ = plan.Scratch<int32_t>(entries);
  list_tokens_ = plan.Scratch<int32_t>(entries);
  list_count_ = plan.Scratch<int32_t>(rows_.size() * kv_heads);
  RETURN_IF_ERROR(counters_.Reserve(plan, rows_.size() * kv_heads * kSparseCounterCount));
  const int32_t lists = static_cast<int32_t>(rows_.size()) * kv_heads;
  RETURN_IF_ERROR(prefetcher_.Prepare(StagingKind::kResolve, lists, max_slots_));
  return prefetcher_.Prepare(StagingKind::kPredict, lists, max_slots_);
}

void SparseDecodeKv::Bind(const StepPlan& plan) {
  if (rows_.empty()) return;
  d_rows_ = plan.Device(plan_rows_);
  d_write_blocks_ = plan.Device(write_blocks_);
  d_write_offsets_ = plan.Device(write_offsets_);
  d_list_begin_ = plan.Device(list_begin_);
  d_scores_ = plan.Device(scores_);
  d_list_pages_ = plan.Device(list_pages_);
  d_list_tokens_ = plan.Device(list_tokens_);
  d_list_count_ = plan.Device(list_count_);
  counters_.Bind(plan);
}

SparseScoreArgs SparseDecodeKv::ScoreArgs(int32_t layer) const {
  SparseScoreArgs a;
  a.rows = d_rows_;
  a.layer = layer;
  a.num_heads = shape_.heads;
  a.num_kv_heads = shape_.kv_heads;
  a.max_candidates = max_candidates_;
  a.scoring = index_.scoring();
  a.summaries = index_.summaries();
  a.host_pool = store_.pool();
  a.scores = d_scores_;
  return a;
}

SparseSelectArgs SparseDecodeKv::SelectArgs(int32_t layer, SelectMode mode) const {
  SparseSelectArgs a;
  a.rows = d_rows_;
  a.layer = layer;
  a.num_kv_heads = shape_.kv_heads;
  a.page_size = device_.page_size();
  a.mode = mode;
  a.max_cache_slots = max_slots_;
  a.stage_ranked = options_.speculation == SpeculationMode::kCrossStep ||
                   options_.speculation == SpeculationMode::kBoth;
  a.defer_missing = deferred();
  a.scores = d_scores_;
  a.device_pool = PagesOf(device_.Layer(layer));
  a.host_pool = store_.pool();
  a.counters = counters_.Device();
  return a;
}

void SparseDecodeKv::Attend(int32_t layer, const Mat& q, const Mat& k, const Mat& v, Mat* out) {
  if (rows_.empty()) return;
  const int64_t n = static_cast<int64_t>(rows_.size());
  const KvLayerView dev = device_.Layer(layer);
  if (any_retire_) {
    backend_.RetireWindowPages(
        SparseRetireArgs{d_rows_, layer, shape_.kv_heads, max_slots_, PagesOf(dev)});
  }
  backend_.WriteKv(k.Rows(first_row_, n), v.Rows(first_row_, n),
                   KvWrite{d_write_blocks_, d_write_offsets_}, dev);
  if (any_complete_) {
    backend_.CompletePages(SparseCompleteArgs{d_rows_, layer, shape_.kv_heads, PagesOf(dev),
                                              store_.pool(), index_.summaries()});
  }
  if (any_scoring_) backend_.ScorePages(q, ScoreArgs(layer));
  // The retirement above claims only slots no copy of an earlier step can still be loading
  // (their stamps are older than the previous step's use, and that step awaited them), so
  // waiting here, after the scoring, keeps the defer policy deterministic.
  if (deferred()) prefetcher_.AwaitEarlierSteps(layer);
  SparseSelectArgs select = SelectArgs(layer, SelectMode::kResolve);
  select.staging = prefetcher_.Staging(StagingKind::kResolve, layer);
  select.list_pages = d_list_pages_;
  select.list_tokens = d_list_tokens_;
  select.list_count = d_list_count_;
  backend_.SelectPages(select);
  // Late pages (this step's cross_layer copies) are attended from their slots: they land first.
  // Before the launch below, which stages the next step's pages on the same stream.
  if (deferred()) prefetcher_.AwaitLayer(layer);
  prefetcher_.Launch(StagingKind::kResolve, layer);

  if (observer_) Observe(layer, /*after=*/false);
  if (recall_ != nullptr) MeasureRecall(layer, q);
  SparseAttentionBatch batch;
  batch.first_row = first_row_;
  batch.rows = static_cast<int32_t>(n);
  batch.list_begin = d_list_begin_;
  batch.list_count = d_list_count_;
  batch.pages = d_list_pages_;
  batch.page_tokens = d_list_tokens_;
  batch.max_pages = max_list_;
  batch.num_heads = shape_.heads;
  batch.num_kv_heads = shape_.kv_heads;
  batch.scale = shape_.softmax_scale;
  backend_.SparseDecodeAttention(q, batch, PagesOf(dev), store_.pool(), out);
  if (observer_) Observe(layer, /*after=*/true);
}

RowRange SparseDecodeKv::EarlyQueryRows() const {
  const bool cross_layer = options_.speculation == SpeculationMode::kCrossLayer ||
                           options_.speculation == SpeculationMode::kBoth;
  // Only rows with more candidates than their budget have anything to guess.
  if (!cross_layer || !any_scoring_) return {};
  return {first_row_, static_cast<int64_t>(rows_.size())};
}

void SparseDecodeKv::PredictLayer(int32_t layer, const Mat& q) {
  SparseScoreArgs score = ScoreArgs(layer);
  score.q_first_row = first_row_;  // q holds only the early rows
  backend_.ScorePages(q, score);
  // Its claims, like the resolve's, must not depend on whether an earlier copy has landed.
  if (deferred()) prefetcher_.AwaitEarlierSteps(layer);
  SparseSelectArgs select = SelectArgs(layer, SelectMode::kStage);
  select.urgent = true;
  select.staging = prefetcher_.Staging(StagingKind::kPredict, layer);
  backend_.SelectPages(select);
  prefetcher_.Launch(StagingKind::kPredict, layer);
}

void SparseDecodeKv::EndStep() {
  if (!rows_.empty()) counters_.Enqueue();
}

void SparseDecodeKv::FinishStep(SparseStepStats* step, double stall_seconds) {
  const int64_t page_bytes = static_cast<int64_t>(store_.page_bytes());
  const int64_t* counts = counters_.Host();
  for (size_t i = 0; i < rows_.size(); ++i) {
    KvStats& s = rows_[i].ws->stats;
    s.stall_seconds += stall_seconds;
    for (int32_t h = 0; h < shape_.kv_heads; ++h) {
      const int64_t* c = counts + (i * shape_.kv_heads + h) * kSparseCounterCount;
      AddSparseCounters(c, page_bytes, &s);
      AddSparseCounters(c, page_bytes, step);
    }
  }
  rows_.clear();
}

void SparseDecodeKv::Observe(int32_t layer, bool after) {
  CHECK(backend_.memory_is_host_readable())
      << "the attention observer reads backend memory in place (the CPU backend)";
  AttendedPages a;
  a.layer = layer;
  a.after = after;
  for (const SparseDecodeRow& r : rows_) {
    a.rows.push_back(r.ws);
    a.positions.push_back(r.pos);
  }
  a.list_begin = absl::MakeConstSpan(d_list_begin_.data(), d_list_begin_.size());
  a.list_count = absl::MakeConstSpan(d_list_count_.data(), d_list_count_.size());
  a.pages = absl::MakeConstSpan(d_list_pages_.data(), d_list_pages_.size());
  a.tokens = absl::MakeConstSpan(d_list_tokens_.data(), d_list_tokens_.size());
  observer_(a);
}

void SparseDecodeKv::MeasureRecall(int32_t layer, const Mat& q) {
  // Recall = exact attention mass on the attended keys. Every page before the current one is on
  // the host (prefilled or written back when full); the current page only in its device slot.
  CHECK(backend_.memory_is_host_readable())
      << "the recall probe reads backend memory in place (the CPU backend)";
  const int32_t ps = device_.page_size();
  const int32_t hd = shape_.head_dim;
  const int32_t group = shape_.heads / shape_.kv_heads;
  const float scale = shape_.softmax_scale;
  const PagePoolView dev = PagesOf(device_.Layer(layer));
  const PagePoolView host = store_.pool();
  auto append_keys = [&](const void* page, int32_t n, std::vector<float>* out) {
    const size_t at = out->size();
    out->resize(at + static_cast<size_t>(n) * hd);
    ConvertToF32(store_.dtype(), page, out->data() + at, static_cast<size_t>(n) * hd);
  };
  std::vector<float> all_keys, attended;
  for (size_t i = 0; i < rows_.size(); ++i) {
    const WorkingSet& ws = *rows_[i].ws;
    const int32_t pos = rows_[i].pos;
    const int32_t current = pos / ps;
    for (int32_t h = 0; h < shape_.kv_heads; ++h) {
      all_keys.clear();
      attended.clear();
      for (int32_t p = 0; p <= current; ++p) {
        const void* base =
            p < current
                ? store_.Page(ws.host().page(layer, h, p))
                : dev.page(ws.device_blocks()[ws.write_slot(current)] * shape_.kv_heads + h);
        append_keys(base, std::min(ps, pos - p * ps + 1), &all_keys);
      }
      const size_t list = i * shape_.kv_heads + h;
      const int32_t first = d_list_begin_.data()[list];
      for (int32_t e = first; e < first + d_list_count_.data()[list]; ++e) {
        const int32_t ref = d_list_pages_.data()[e];
        append_keys(IsHostPageRef(ref) ? host.page(HostPageOf(ref)) : dev.page(ref),
                    d_list_tokens_.data()[e], &attended);
      }
      for (int32_t g = 0; g < group; ++g) {
        const float* qv = q.row(rows_[i].q_row) + static_cast<size_t>(h * group + g) * hd;
        auto score = [&](const float* key) {
          float d = 0;
          for (int32_t c = 0; c < hd; ++c) d += qv[c] * key[c];
          return d * scale;
        };
        float mx = -INFINITY;
        for (size_t at = 0; at < all_keys.size(); at += hd) mx = std::max(mx, score(&all_keys[at]));
        double total = 0, kept = 0;
        for (size_t at = 0; at < all_keys.size(); at += hd) {
          total += std::exp(score(&all_keys[at]) - mx);
        }
        for (size_t at = 0; at < attended.size(); at += hd) {
          kept += std::exp(score(&attended[at]) - mx);
        }
        recall_->mass_sum += std::min(1.0, kept / total);
        ++recall_->samples;
      }
    }
  }
}

}  // namespace specula
