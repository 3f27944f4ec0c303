#include "engine/kv/decode_start.h"

#include <algorithm>

#include "engine/common/check.h"
#include "engine/common/status_macros.h"

namespace specula {

DecodeStart::DecodeStart(SparseKvCache& cache, WorkingSet& ws, int64_t prompt_tokens,
                         int64_t cached_tokens)
    : cache_(cache),
      ws_(ws),
      prompt_tokens_(prompt_tokens),
      cached_tokens_(cached_tokens),
      counters_(cache.backend()) {}

int32_t DecodeStart::candidates() const {
  const WorkingSetGeometry& g = ws_.geometry();
  // At the first decode step, whose token is at position prompt_tokens_.
  return g.window_begin(static_cast<int32_t>(prompt_tokens_ / g.page_size)) - g.sink_pages;
}

absl::Status DecodeStart::Plan(absl::Span<const int32_t> layers, StepPlan& plan) {
  const WorkingSetGeometry& g = ws_.geometry();
  layers_.assign(g.layers, LayerPlan());
  const int32_t first = static_cast<int32_t>(cached_tokens_ / g.page_size);
  const int32_t full = static_cast<int32_t>(prompt_tokens_ / g.page_size);
  const size_t n = static_cast<size_t>(std::max(0, full - first)) * g.kv_heads;
  for (int32_t layer : layers) {
    LayerPlan& lp = layers_[layer];
    if (cache_.index().scoring() != PageScoring::kQuest || n == 0) continue;
    lp.summary_pages = plan.Reserve<int32_t>(n);
    lp.summary_dst = plan.Reserve<int32_t>(n);
    size_t i = 0;
    for (int32_t p = first; p < full; ++p) {
      for (int32_t h = 0; h < g.kv_heads; ++h, ++i) {
        plan.Host(lp.summary_pages)[i] = p * g.kv_heads + h;
        plan.Host(lp.summary_dst)[i] = ws_.host().page(layer, h, p);
      }
    }
  }
  row_ = plan.Reserve<SparseRowPlan>(1);
  SparseRowPlan& row = *plan.Host(row_);
  row = SparseRowPlan();
  row.seq = ws_.device();
  row.q_row = 0;  // scored with the last row's query alone
  row.pos = static_cast<int32_t>(prompt_tokens_);
  row.step = 0;  // the pages are for step 1
  row.candidates = candidates();
  scores_ = plan.Scratch<float>(std::max(1, g.kv_heads * candidates()));
  RETURN_IF_ERROR(counters_.Reserve(plan, static_cast<size_t>(g.kv_heads) * kSparseCounterCount));
  return cache_.prefetcher().Prepare(StagingKind::kPrefill, g.kv_heads, std::max(g.cache_slots, 1));
}

void DecodeStart::Bind(const StepPlan& plan) {
  plan_ = &plan;
  counters_.Bind(plan);
}

void DecodeStart::Run(int32_t layer, const PromptPages& pages, const Mat& last_query) {
  const LayerPlan& lp = layers_[layer];
  if (lp.summary_pages.count > 0) {
    cache_.backend().SummarizePages(
        PageSummaryArgs{plan_->Device(pages.host_store ? lp.summary_dst : lp.summary_pages),
                        plan_->Device(lp.summary_dst), pages.pool, cache_.index().summaries()});
  }
  LoadSinksAndWindow(layer, pages);
  SelectFirstPages(layer, last_query);
}

void DecodeStart::LoadSinksAndWindow(int32_t layer, const PromptPages& pages) {
  const WorkingSetGeometry& g = ws_.geometry();
  const int32_t ps = g.page_size;
  Backend& backend = cache_.backend();
  const PagePoolView slots = PagesOf(cache_.device().Layer(layer));
  const int32_t written = static_cast<int32_t>((prompt_tokens_ + ps - 1) / ps);
  const int32_t window_begin = g.window_begin(static_cast<int32_t>(prompt_tokens_ / ps));
  copies_.clear();
  auto load = [&](int32_t page, int32_t slot) {
    for (int32_t h = 0; h < g.kv_heads; ++h) {
      const int64_t src = pages.host_store ? ws_.host().page(layer, h, page)
                                           : static_cast<int64_t>(page) * g.kv_heads + h;
      copies_.push_back(
          {slots.page(static_cast<int64_t>(ws_.device_blocks()[slot]) * g.kv_heads + h),
           pages.pool.page(src)});
    }
  };
  for (int32_t p = 0; p < std::min(g.sink_pages, written); ++p) load(p, ws_.sink_slot(p));
  for (int32_t p = window_begin; p < written; ++p) load(p, ws_.ring_slot(p));
  if (!copies_.empty()) backend.compute_stream().CopyPages(copies_, slots.page_bytes());
}

void DecodeStart::SelectFirstPages(int32_t layer, const Mat& last_query) {
  const WorkingSetGeometry& g = ws_.geometry();
  const int32_t ps = g.page_size;
  Backend& backend = cache_.backend();
  const SpeculationMode mode = cache_.options().speculation;
  const bool cross_step = mode == SpeculationMode::kCrossStep || mode == SpeculationMode::kBoth;
  const bool all_fit = candidates() <= g.budget_pages;
  if (candidates() <= 0 || (!all_fit && !cross_step)) return;
  SparseSelectArgs select;
  select.rows = plan_->Device(row_);
  select.layer = layer;
  select.num_kv_heads = g.kv_heads;
  select.page_size = ps;
  select.max_cache_slots = std::max(g.cache_slots, 1);
  select.device_pool = PagesOf(cache_.device().Layer(layer));
  select.host_pool = cache_.store().pool();
  select.counters = counters_.Device();
  if (all_fit) {
    select.mode = SelectMode::kLoadNow;  // the first step selects them all anyway
    backend.SelectPages(select);
    return;
  }
  // The last prompt row's query predicts the first decode step's pages.
  SparseScoreArgs score;
  score.rows = select.rows;
  score.layer = layer;
  score.num_heads = cache_.shape().heads;
  score.num_kv_heads = g.kv_heads;
  score.max_candidates = candidates();
  score.scoring = cache_.index().scoring();
  score.summaries = cache_.index().summaries();
  score.host_pool = cache_.store().pool();
  score.scores = plan_->Device(scores_);
  backend.ScorePages(last_query, score);
  select.mode = SelectMode::kStage;
  select.scores = score.scores;
  select.staging = cache_.prefetcher().Staging(StagingKind::kPrefill, layer);
  backend.SelectPages(select);
  cache_.prefetcher().Launch(StagingKind::kPrefill, layer);
}

void DecodeStart::FinishStep(SparseStepStats* step) {
  const int64_t page_bytes = static_cast<int64_t>(cache_.store().page_bytes());
  const int64_t* c = counters_.Host();
  // Loading and staging count only fetched and staged pages; the other counters stay 0.
  for (size_t h = 0; h < counters_.size() / kSparseCounterCount; ++h, c += kSparseCounterCount) {
    AddSparseCounters(c, page_bytes, &ws_.stats);
    AddSparseCounters(c, page_bytes, step);
  }
}

}  // namespace specula
