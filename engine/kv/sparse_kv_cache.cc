#include "engine/kv/sparse_kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_format.h"
#include "engine/common/check.h"
#include "engine/common/status_macros.h"
#include "engine/kv/top_pages.h"

namespace specula {
namespace {

int32_t PagesOf(int64_t tokens, int32_t page_size) {
  return static_cast<int32_t>((tokens + page_size - 1) / page_size);
}

// Slot recency stamps, in half steps: a cross_step prediction for step t ranks below a real use
// at t and below a cross_layer prediction for t (computed from step t's own hidden state), which
// may therefore replace it; nothing replaces a page used or cross_layer-predicted at t for t.
uint64_t PredictStamp(uint64_t step) { return 2 * step; }
uint64_t UseStamp(uint64_t step) { return 2 * step + 1; }

enum class PageOutcome { kHit, kLate, kMissed };

// Adds one selected page's outcome to KvStats or SparseStepStats.
template <typename Stats>
void CountPage(PageOutcome outcome, Stats* stats) {
  switch (outcome) {
    case PageOutcome::kHit:
      ++stats->pages_hit;
      return;
    case PageOutcome::kLate:
      ++stats->pages_late;
      return;
    case PageOutcome::kMissed:
      ++stats->pages_missed;
      return;
  }
}

// Predictions queued beyond this are stale before they run; the oldest are dropped.
constexpr size_t kMaxQueuedPredictions = 4096;
constexpr size_t kMaxLatencySamples = 65536;

}  // namespace

absl::StatusOr<std::unique_ptr<SparseKvCache>> SparseKvCache::Create(
    const SparseOptions& options, const SparseModelShape& shape, Backend& backend,
    KvPool& device) {
  RETURN_IF_ERROR(ValidateSparseOptions(options));
  if (shape.layers <= 0 || shape.kv_heads <= 0 || shape.head_dim <= 0 ||
      shape.heads % shape.kv_heads != 0) {
    return absl::InvalidArgumentError("sparse kv cache: bad model shape");
  }
  std::unique_ptr<SparseKvCache> c(
      new SparseKvCache(options, shape, device.page_size(), backend, device));
  HostKvStoreOptions host;
  host.num_layers = shape.layers;
  host.num_kv_heads = shape.kv_heads;
  host.head_dim = shape.head_dim;
  host.page_size = device.page_size();
  host.capacity_tokens = options.host_capacity_tokens;
  host.dtype = device.dtype();  // pages move between host and slots as bytes
  auto store = HostKvStore::Create(host);
  if (!store.ok()) {
    return absl::Status(store.status().code(),
                        absl::StrFormat("sparse.host_capacity_tokens = %d: %s",
                                        options.host_capacity_tokens, store.status().message()));
  }
  c->store_ = std::move(*store);
  c->key_scratch_.resize(static_cast<size_t>(c->page_size_) * shape.head_dim);
  ASSIGN_OR_RETURN(c->selector_, MakePageSelector(options.selector, *c->store_));
  c->copier_ = backend.CreatePageCopier();
  SparseKvCache* self = c.get();
  c->executor_ = std::make_unique<PrefetchExecutor>(
      options.prefetch_threads, kMaxQueuedPredictions, backend,
      [self](PrefetchTask& task, PageCopier& copier) { self->RunTask(task, copier); });
  return c;
}

SparseKvCache::SparseKvCache(const SparseOptions& options, const SparseModelShape& shape,
                             int32_t page_size, Backend& backend, KvPool& device)
    : options_(options), shape_(shape), page_size_(page_size), backend_(backend),
      device_(device) {}

SparseKvCache::~SparseKvCache() {
  executor_.reset();  // no task may run while working sets go away
  while (!live_.empty()) Release(*live_.back());
}

int64_t SparseKvCache::EffectiveBudget(int64_t requested) const {
  return requested > 0 ? requested : options_.budget_tokens;
}

WorkingSetGeometry SparseKvCache::Geometry(int64_t total_tokens, int64_t budget_tokens) const {
  WorkingSetGeometry g;
  g.layers = shape_.layers;
  g.kv_heads = shape_.kv_heads;
  g.page_size = page_size_;
  g.sink_pages = PagesOf(options_.sink_tokens, page_size_);
  g.window_pages = PagesOf(options_.recent_tokens, page_size_);
  const int64_t budget = EffectiveBudget(budget_tokens);
  const int64_t extra = options_.effective_prefetch_extra_tokens(budget);
  // No more slots than the request can ever have candidates: full pages before the window.
  const int32_t max_candidates =
      std::max(0, PagesOf(total_tokens, page_size_) - 1 - g.window_pages - g.sink_pages);
  g.budget_pages = std::min(PagesOf(budget, page_size_), max_candidates);
  g.cache_slots = std::min(g.budget_pages + PagesOf(extra, page_size_), max_candidates);
  return g;
}

absl::Status SparseKvCache::CheckCapacity(int64_t total_tokens, int64_t budget_tokens) const {
  if (store_->PagesFor(total_tokens) > store_->pages_per_head_capacity()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "prompt + max_tokens (%d tokens) exceeds the sparse host KV capacity of %d tokens "
        "(sparse.host_capacity_tokens)",
        total_tokens, static_cast<int64_t>(store_->pages_per_head_capacity()) * page_size_));
  }
  const int32_t slots = Geometry(total_tokens, budget_tokens).slots_per_head();
  if (slots > device_.num_blocks()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a sparse working set with budget %d tokens needs %d KV cache pages of %d tokens "
        "(sinks + window + budget + prefetch slots), more than kv_cache.capacity_tokens holds "
        "(%d pages)",
        EffectiveBudget(budget_tokens), slots, page_size_, device_.num_blocks()));
  }
  return absl::OkStatus();
}

bool SparseKvCache::HasRoomFor(int64_t total_tokens, int64_t budget_tokens) const {
  const int64_t host_pages = store_->PagesFor(total_tokens) * shape_.layers * shape_.kv_heads;
  return store_->free_pages() >= host_pages &&
         device_.free_blocks() >= Geometry(total_tokens, budget_tokens).slots_per_head();
}

absl::StatusOr<std::shared_ptr<WorkingSet>> SparseKvCache::Admit(int64_t total_tokens,
                                                                 int64_t budget_tokens,
                                                                 int64_t prompt_tokens) {
  RETURN_IF_ERROR(CheckCapacity(total_tokens, budget_tokens));
  const WorkingSetGeometry g = Geometry(total_tokens, budget_tokens);
  if (device_.free_blocks() < g.slots_per_head()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "KV cache full: a sparse working set needs %d pages, %d of %d free", g.slots_per_head(),
        device_.free_blocks(), device_.num_blocks()));
  }
  ASSIGN_OR_RETURN(HostKvSequence host, store_->Reserve(total_tokens));
  auto blocks = device_.Allocate(g.slots_per_head());
  if (!blocks.ok()) {
    store_->Release(host);
    return blocks.status();
  }
  auto ws = std::make_shared<WorkingSet>(g, std::move(host), std::move(*blocks), prompt_tokens);
  ws->stats.sparse = true;
  ws->stats.budget_tokens = EffectiveBudget(budget_tokens);
  device_slots_used_ += static_cast<int64_t>(g.slots_per_head()) * g.layers * g.kv_heads;
  live_.push_back(ws);
  return ws;
}

void SparseKvCache::Quiesce(WorkingSet& ws) {
  std::unique_lock<std::mutex> lock(ws.mu);
  ws.closing = true;
  ws.cv.wait(lock, [&] { return ws.active_tasks == 0; });
  CHECK_EQ(ws.loading_locked(), 0);
}

std::vector<std::shared_ptr<WorkingSet>>::const_iterator SparseKvCache::FindLive(
    const WorkingSet* ws) const {
  return std::find_if(live_.begin(), live_.end(),
                      [&](const std::shared_ptr<WorkingSet>& p) { return p.get() == ws; });
}

bool SparseKvCache::Owns(const WorkingSet* ws) const { return FindLive(ws) != live_.end(); }

void SparseKvCache::Release(WorkingSet& ws) {
  Quiesce(ws);
  store_->Release(ws.mutable_host());
  device_.Free(ws.device_blocks());
  const WorkingSetGeometry& g = ws.geometry();
  device_slots_used_ -= static_cast<int64_t>(g.slots_per_head()) * g.layers * g.kv_heads;
  auto it = FindLive(&ws);
  CHECK(it != live_.end());
  live_.erase(it);
}

const std::shared_ptr<WorkingSet>& SparseKvCache::Owner(const WorkingSet& ws) const {
  auto it = FindLive(&ws);
  CHECK(it != live_.end());
  return *it;
}

KvStats SparseKvCache::Stats(const WorkingSet& ws) const {
  KvStats s = ws.stats;
  s.bytes_prefetched = ws.bytes_prefetched.load();
  return s;
}

void* SparseKvCache::SlotPage(int32_t layer, const WorkingSet& ws, int32_t slot,
                              int32_t head) const {
  const KvLayerView v = device_.Layer(layer);
  return static_cast<char*>(v.base) +
         static_cast<size_t>(PoolPageId(ws, slot, head)) * store_->page_bytes();
}

void SparseKvCache::SummarizePage(PageId id) {
  store_->ReadKeys(id, page_size_, key_scratch_.data());
  selector_->Summarize(id, key_scratch_.data(), page_size_);
}

int32_t SparseKvCache::PoolPageId(const WorkingSet& ws, int32_t slot, int32_t head) const {
  return ws.device_blocks()[slot] * shape_.kv_heads + head;
}

KvLayerView SparseKvCache::HostView() const {
  // Every host page as its own one-head block, so block tables are host page ids.
  KvLayerView v;
  v.base = store_->data();
  v.dtype = store_->dtype();
  v.num_kv_heads = 1;
  v.page_size = page_size_;
  v.head_dim = shape_.head_dim;
  return v;
}

void SparseKvCache::Prefill(int32_t layer, absl::Span<const SparseRows> rows, const Mat& q,
                            const Mat& k, const Mat& v, Mat* out) {
  const int32_t hd = shape_.head_dim;
  const int32_t group = shape_.heads / shape_.kv_heads;
  const int32_t ps = page_size_;
  const KvLayerView host = HostView();
  std::vector<int32_t> write_pages, write_offsets;
  for (const SparseRows& r : rows) {
    CHECK(r.prefill);
    WorkingSet& ws = *r.ws;
    const int32_t end = r.start + r.q_len;
    for (int32_t h = 0; h < shape_.kv_heads; ++h) {
      write_pages.clear();
      write_offsets.clear();
      for (int32_t pos = r.start; pos < end; ++pos) {
        write_pages.push_back(ws.host().page(layer, h, pos / ps));
        write_offsets.push_back(pos % ps);
      }
      const Mat kh = k.Rows(r.q_begin, r.q_len).Cols(static_cast<int64_t>(h) * hd, hd);
      const Mat vh = v.Rows(r.q_begin, r.q_len).Cols(static_cast<int64_t>(h) * hd, hd);
      backend_.WriteKv(kh, vh, KvWrite{write_pages, write_offsets}, host);
      // Pages completed by this chunk become selectable.
      for (int32_t p = r.start / ps; (p + 1) * ps <= end; ++p) {
        SummarizePage(ws.host().page(layer, h, p));
      }
      AttentionSeq a;
      a.q_begin = r.q_begin;
      a.q_len = r.q_len;
      a.kv_len = end;
      AttentionBatch ab;
      ab.seqs = absl::MakeConstSpan(&a, 1);
      ab.blocks = ws.host().pages(layer, h);
      ab.num_heads = group;
      ab.scale = AttentionScale(hd);
      const int64_t q_col = static_cast<int64_t>(h) * group * hd;
      Mat oh = out->Cols(q_col, static_cast<int64_t>(group) * hd);
      backend_.PagedAttention(q.Cols(q_col, static_cast<int64_t>(group) * hd), ab, host, &oh);
    }
    if (end == ws.prompt_tokens()) {
      LoadWindow(layer, ws, end);
      const int32_t candidate_end = ws.geometry().window_begin(end / ps);
      if (wants_step_prediction() && candidate_end - ws.geometry().sink_pages > ws.geometry().budget_pages) {
        // The last prompt token's query predicts the first decode step's pages.
        backend_.Synchronize();
        std::vector<float> last(q.cols);
        backend_.CopyToHost(last.data(), q.row(r.q_begin + r.q_len - 1), q.cols * sizeof(float));
        SubmitQueries(layer, Owner(ws), 1, last.data(), candidate_end);
      }
    }
  }
}

void SparseKvCache::LoadWindow(int32_t layer, WorkingSet& ws, int64_t prompt_tokens) {
  const WorkingSetGeometry& g = ws.geometry();
  const int32_t ps = page_size_;
  const int32_t written = PagesOf(prompt_tokens, ps);  // pages holding prompt tokens
  const int32_t current = static_cast<int32_t>(prompt_tokens / ps);  // first decode token's page
  const int32_t window_begin = g.window_begin(current);
  for (int32_t h = 0; h < shape_.kv_heads; ++h) {
    auto load = [&](int32_t page, int32_t slot) {
      copier_->Copy(SlotPage(layer, ws, slot, h), store_->Page(ws.host().page(layer, h, page)),
                    store_->page_bytes());
    };
    for (int32_t p = 0; p < std::min(g.sink_pages, written); ++p) load(p, ws.sink_slot(p));
    for (int32_t p = window_begin; p < written; ++p) load(p, ws.ring_slot(p));
    if (window_begin - g.sink_pages <= g.budget_pages) {
      // The budget covers every candidate: the first step would select them all anyway.
      std::lock_guard<std::mutex> lock(ws.mu);
      for (int32_t p = g.sink_pages; p < window_begin; ++p) {
        const int32_t j = ws.ClaimLocked(lh(layer, h), p, std::numeric_limits<uint64_t>::max());
        CHECK_GE(j, 0);
        load(p, ws.cache_slot(j));
        ws.FinishLoadLocked(lh(layer, h), j);
        ws.stats.bytes_fetched += static_cast<int64_t>(store_->page_bytes());
        step_.bytes_fetched += static_cast<int64_t>(store_->page_bytes());
      }
    }
  }
  ws.window_begin = window_begin;
}

void SparseKvCache::RetireWindowPages(int32_t layer, WorkingSet& ws, int32_t new_begin) {
  for (int32_t p = ws.window_begin; p < new_begin; ++p) {
    for (int32_t h = 0; h < shape_.kv_heads; ++h) {
      int32_t j;
      {
        std::lock_guard<std::mutex> lock(ws.mu);
        // A cross_layer prediction may have staged it from the host already (it was written
        // back when it filled).
        if (ws.FindLocked(lh(layer, h), p) >= 0) continue;
        // Never evict a page the previous step used or one predicted for this step; a page
        // that finds no slot is fetched if it is ever selected.
        j = ws.ClaimLocked(lh(layer, h), p, UseStamp(ws.decode_step - 1));
      }
      if (j < 0) continue;
      copier_->Copy(SlotPage(layer, ws, ws.cache_slot(j), h), SlotPage(layer, ws, ws.ring_slot(p), h),
                    store_->page_bytes());
      std::lock_guard<std::mutex> lock(ws.mu);
      ws.slot_locked(lh(layer, h), j).last_use = UseStamp(ws.decode_step - 1);
      ws.FinishLoadLocked(lh(layer, h), j);
    }
  }
}

void SparseKvCache::TopCandidates(int32_t layer, int32_t head, const WorkingSet& ws,
                                  int32_t candidate_end, const float* queries, int32_t k,
                                  std::vector<float>* scores, std::vector<int32_t>* out) const {
  const int32_t first = ws.geometry().sink_pages;
  const int32_t n = candidate_end - first;
  const absl::Span<const PageId> all = ws.host().pages(layer, head);
  const int32_t group = shape_.heads / shape_.kv_heads;
  scores->resize(n);
  selector_->Score(absl::MakeConstSpan(queries, static_cast<size_t>(group) * shape_.head_dim),
                   group, all.subspan(first, n), absl::MakeSpan(*scores));
  SelectTopPages(*scores, k, out);
  for (int32_t& p : *out) p += first;
}

void SparseKvCache::Resolve(int32_t layer, int32_t head, WorkingSet& ws, int32_t pos,
                            const float* queries, std::vector<int32_t>* attend_pages,
                            std::vector<int32_t>* attend_tokens,
                            std::vector<int32_t>* attend_logical, std::vector<int32_t>* predicted,
                            std::vector<int32_t>* skipped) {
  const WorkingSetGeometry& g = ws.geometry();
  const int32_t ps = page_size_;
  const int32_t current = pos / ps;
  const int32_t candidate_end = g.window_begin(current);
  const int32_t n_candidates = candidate_end - g.sink_pages;

  std::vector<int32_t> selected;
  if (n_candidates <= g.budget_pages) {
    for (int32_t p = g.sink_pages; p < candidate_end; ++p) selected.push_back(p);
  } else {
    std::vector<float> scores;
    TopCandidates(layer, head, ws, candidate_end, queries, g.budget_pages, &scores, &selected);
    if (wants_step_prediction()) {
      // The pages just below the cut are the likeliest newcomers at the next step.
      SelectTopPages(scores, g.cache_slots, predicted);
      for (int32_t& p : *predicted) p += g.sink_pages;
    }
  }

  const int32_t l_h = lh(layer, head);
  std::vector<int32_t> resident(selected.size(), -1);  // cache slot per selected page
  {
    std::unique_lock<std::mutex> lock(ws.mu);
    ws.resolved_step[layer] = ws.decode_step;
    // First pin every selected page already mapped (ready, or loading for a prediction), so
    // fetching a miss below can never evict a page this step selected. At most B pins of C >= B
    // slots: a miss always finds a slot, or a loading one that will finish.
    for (size_t i = 0; i < selected.size(); ++i) {
      const int32_t j = ws.FindLocked(l_h, selected[i]);
      if (j < 0) continue;
      WorkingSet::CacheSlot& s = ws.slot_locked(l_h, j);
      s.pin = ws.active_pin;
      s.last_use = std::max(s.last_use, UseStamp(ws.decode_step));
    }
    for (size_t i = 0; i < selected.size(); ++i) {
      const int32_t p = selected[i];
      // What attention finds when it needs the page: resident (a hit), still being copied by a
      // prefetch (late), or absent (a miss).
      const int32_t found = ws.FindLocked(l_h, p);
      const PageOutcome outcome =
          found < 0                                                           ? PageOutcome::kMissed
          : ws.slot_locked(l_h, found).state == WorkingSet::SlotState::kReady ? PageOutcome::kHit
                                                                              : PageOutcome::kLate;
      double waited = 0;
      int32_t j;
      while (true) {
        j = ws.FindLocked(l_h, p);
        if (j >= 0 && ws.slot_locked(l_h, j).state == WorkingSet::SlotState::kReady) break;
        if (options_.miss_policy == MissPolicy::kSkip) {
          // Not resident now: attend without it. A loading page is on its way already (late).
          if (j < 0) skipped->push_back(p);
          j = -1;
          break;
        }
        if (j < 0) {
          j = ws.ClaimLocked(l_h, p, std::numeric_limits<uint64_t>::max());
          if (j >= 0) {
            ws.slot_locked(l_h, j).pin = ws.active_pin;
            const double t0 = MonotonicSeconds();
            lock.unlock();
            copier_->Copy(SlotPage(layer, ws, ws.cache_slot(j), head),
                          store_->Page(ws.host().page(layer, head, p)), store_->page_bytes());
            lock.lock();
            ws.FinishLoadLocked(l_h, j);
            waited += MonotonicSeconds() - t0;
            ws.stats.bytes_fetched += static_cast<int64_t>(store_->page_bytes());
            step_.bytes_fetched += static_cast<int64_t>(store_->page_bytes());
            continue;  // re-check: the slot is ready now
          }
        }
        // Loading (a prefetch is copying it) or no claimable slot: wait for a copy to land.
        const double t0 = MonotonicSeconds();
        ws.cv.wait(lock);
        waited += MonotonicSeconds() - t0;
      }
      ws.stats.stall_seconds += waited;
      step_.stall_seconds += waited;
      if (j >= 0) {
        WorkingSet::CacheSlot& s = ws.slot_locked(l_h, j);
        s.pin = ws.active_pin;
        s.last_use = std::max(s.last_use, UseStamp(ws.decode_step));
        resident[i] = j;
      }
      CountPage(outcome, &ws.stats);
      CountPage(outcome, &step_);
    }
  }

  // Attended pages in position order: sinks, selected, window (up to the current page).
  auto add = [&](int32_t slot, int32_t page) {
    attend_pages->push_back(PoolPageId(ws, slot, head));
    attend_tokens->push_back(page == current ? pos % ps + 1 : ps);
    attend_logical->push_back(page);
  };
  for (int32_t p = 0; p < std::min(g.sink_pages, current + 1); ++p) add(ws.sink_slot(p), p);
  for (size_t i = 0; i < selected.size(); ++i) {
    if (resident[i] >= 0) add(ws.cache_slot(resident[i]), selected[i]);
  }
  for (int32_t p = candidate_end; p <= current; ++p) add(ws.ring_slot(p), p);
}

void SparseKvCache::BeginDecodeStep(absl::Span<const SparseRows> rows) {
  for (const SparseRows& r : rows) {
    ++r.ws->decode_step;
    r.ws->published_step.store(r.ws->decode_step);
  }
}

void SparseKvCache::Decode(int32_t layer, absl::Span<const SparseRows> rows, const Mat& q,
                           const Mat& k, const Mat& v, Mat* out) {
  if (rows.empty()) return;
  const int32_t ps = page_size_;
  const int32_t hd = shape_.head_dim;
  const int32_t group = shape_.heads / shape_.kv_heads;
  const int32_t first_row = rows.front().q_begin;
  const KvLayerView dev = device_.Layer(layer);

  std::vector<int32_t> write_blocks, write_offsets;
  for (size_t i = 0; i < rows.size(); ++i) {
    const SparseRows& r = rows[i];
    CHECK(!r.prefill && r.q_len == 1 && r.q_begin == first_row + static_cast<int32_t>(i));
    WorkingSet& ws = *r.ws;
    const WorkingSetGeometry& g = ws.geometry();
    CHECK_GE(ws.window_begin, 0) << "decode before the prompt was prefilled";
    const int32_t current = r.start / ps;
    RetireWindowPages(layer, ws, g.window_begin(current));
    if (layer == shape_.layers - 1) ws.window_begin = g.window_begin(current);
    write_blocks.push_back(ws.device_blocks()[ws.write_slot(current)]);
    write_offsets.push_back(r.start % ps);
  }
  backend_.WriteKv(k.Rows(first_row, rows.size()), v.Rows(first_row, rows.size()),
                   KvWrite{write_blocks, write_offsets}, dev);

  // A page the new token completed goes back to the host store and becomes selectable.
  for (const SparseRows& r : rows) {
    if (r.start % ps != ps - 1) continue;
    WorkingSet& ws = *r.ws;
    const int32_t current = r.start / ps;
    for (int32_t h = 0; h < shape_.kv_heads; ++h) {
      const PageId id = ws.host().page(layer, h, current);
      copier_->Copy(store_->Page(id), SlotPage(layer, ws, ws.write_slot(current), h),
                    store_->page_bytes());
      SummarizePage(id);
    }
  }

  // Resolve every (row, KV head) with the real queries.
  backend_.Synchronize();
  std::vector<float> q_host(static_cast<size_t>(rows.size()) * q.cols);
  for (size_t i = 0; i < rows.size(); ++i) {
    backend_.CopyToHost(q_host.data() + i * q.cols, q.row(first_row + i), q.cols * sizeof(float));
  }
  std::vector<int32_t> page_begin{0}, pages, tokens, logical, predicted, skipped;
  for (size_t i = 0; i < rows.size(); ++i) {
    const SparseRows& r = rows[i];
    WorkingSet& ws = *r.ws;
    PrefetchTask task;
    for (int32_t h = 0; h < shape_.kv_heads; ++h) {
      predicted.clear();
      skipped.clear();
      const float* queries = q_host.data() + i * q.cols + static_cast<size_t>(h) * group * hd;
      Resolve(layer, h, ws, r.start, queries, &pages, &tokens, &logical, &predicted, &skipped);
      page_begin.push_back(static_cast<int32_t>(pages.size()));
      if (!predicted.empty() || !skipped.empty()) {
        task.pages.resize(shape_.kv_heads);
        std::vector<int32_t>& dst = task.pages[h];
        dst = skipped;  // skipped pages first: they are needed for sure
        for (int32_t p : predicted) {
          if (std::find(skipped.begin(), skipped.end(), p) == skipped.end()) dst.push_back(p);
        }
      }
    }
    if (!task.pages.empty()) {
      task.ws = Owner(ws);
      task.layer = layer;
      task.target_step = ws.decode_step + 1;
      task.issued_seconds = MonotonicSeconds();
      executor_->Submit(std::move(task));
    }
    if (recall_ != nullptr) {
      MeasureRecall(layer, ws, r.start, q_host.data() + i * q.cols, page_begin, pages, tokens,
                    static_cast<int64_t>(i) * shape_.kv_heads);
    }
  }

  AttendedPages seen;
  if (observer_) {
    seen.layer = layer;
    for (const SparseRows& r : rows) seen.rows.push_back(r.ws);
    seen.page_begin = page_begin;
    seen.logical = logical;
    seen.pool_pages = pages;
    seen.tokens = tokens;
    observer_(seen);
  }
  SparseAttentionBatch sb;
  sb.page_begin = page_begin;
  sb.pages = pages;
  sb.page_tokens = tokens;
  sb.num_heads = shape_.heads;
  sb.num_kv_heads = shape_.kv_heads;
  sb.scale = AttentionScale(hd);
  PagePoolView pool;
  pool.base = dev.base;
  pool.dtype = dev.dtype;
  pool.page_size = ps;
  pool.head_dim = hd;
  Mat o = out->Rows(first_row, rows.size());
  backend_.SparseDecodeAttention(q.Rows(first_row, rows.size()), sb, pool, &o);
  backend_.Synchronize();
  if (observer_) {
    seen.after = true;
    observer_(seen);
  }

  // The attention is done: its slots may be replaced again.
  for (const SparseRows& r : rows) {
    std::lock_guard<std::mutex> lock(r.ws->mu);
    ++r.ws->active_pin;
  }
}

bool SparseKvCache::wants_step_prediction() const {
  return options_.speculation == SpeculationMode::kCrossStep ||
         options_.speculation == SpeculationMode::kBoth;
}

bool SparseKvCache::wants_layer_prediction() const {
  return options_.speculation == SpeculationMode::kCrossLayer ||
         options_.speculation == SpeculationMode::kBoth;
}

void SparseKvCache::PredictLayer(int32_t layer, absl::Span<const SparseRows> rows,
                                 absl::Span<const float> queries) {
  const size_t width = static_cast<size_t>(shape_.heads) * shape_.head_dim;
  CHECK_EQ(queries.size(), rows.size() * width);
  for (size_t i = 0; i < rows.size(); ++i) {
    WorkingSet& ws = *rows[i].ws;
    const WorkingSetGeometry& g = ws.geometry();
    const int32_t candidate_end = g.window_begin(rows[i].start / page_size_);
    if (candidate_end - g.sink_pages <= g.budget_pages) continue;  // all fit: nothing to guess
    SubmitQueries(layer, Owner(ws), ws.decode_step, queries.data() + i * width, candidate_end,
                  /*urgent=*/true);
  }
}

void SparseKvCache::SubmitQueries(int32_t layer, const std::shared_ptr<WorkingSet>& ws,
                                  uint64_t target_step, const float* queries,
                                  int32_t candidate_end, bool urgent) {
  PrefetchTask task;
  task.urgent = urgent;
  task.ws = ws;
  task.layer = layer;
  task.target_step = target_step;
  task.queries.assign(queries, queries + static_cast<size_t>(shape_.heads) * shape_.head_dim);
  task.candidate_end = candidate_end;
  task.issued_seconds = MonotonicSeconds();
  executor_->Submit(std::move(task));
}

bool SparseKvCache::StaleLocked(const WorkingSet& ws, const PrefetchTask& task) const {
  // Worthless: the sequence is going away, its step has passed, or the layer has already
  // resolved the step the prediction was for (a late cross_layer prediction).
  return ws.closing || ws.published_step.load() > task.target_step ||
         ws.resolved_step[task.layer] >= task.target_step;
}

void SparseKvCache::RunTask(PrefetchTask& task, PageCopier& copier) {
  WorkingSet& ws = *task.ws;
  {
    std::lock_guard<std::mutex> lock(ws.mu);
    if (StaleLocked(ws, task)) return;
    ++ws.active_tasks;
  }
  const WorkingSetGeometry& g = ws.geometry();
  const int32_t group = shape_.heads / shape_.kv_heads;
  std::vector<double> latencies;
  int64_t bytes = 0;
  std::vector<float> scores;
  std::unique_lock<std::mutex> lock(ws.mu, std::defer_lock);
  const bool score = !task.queries.empty();  // else the engine ranked the pages already
  if (score) task.pages.assign(shape_.kv_heads, {});
  for (int32_t h = 0; h < static_cast<int32_t>(task.pages.size()); ++h) {
    if (score) {
      // Reads only summaries of candidate pages, which cannot change until release.
      TopCandidates(task.layer, h, ws, task.candidate_end,
                    task.queries.data() + static_cast<size_t>(h) * group * shape_.head_dim,
                    g.cache_slots, &scores, &task.pages[h]);
    }
    const int32_t l_h = lh(task.layer, h);
    const uint64_t stamp = task.urgent ? UseStamp(task.target_step) : PredictStamp(task.target_step);
    lock.lock();
    if (StaleLocked(ws, task)) {
      lock.unlock();
      break;
    }
    // Stamp the predicted pages already resident first, so staging the others cannot evict them.
    for (int32_t p : task.pages[h]) {
      const int32_t j = ws.FindLocked(l_h, p);
      if (j >= 0) {
        WorkingSet::CacheSlot& s = ws.slot_locked(l_h, j);
        s.last_use = std::max(s.last_use, stamp);
      }
    }
    for (int32_t p : task.pages[h]) {
      if (StaleLocked(ws, task)) break;
      if (ws.FindLocked(l_h, p) >= 0) continue;
      const int32_t j = ws.ClaimLocked(l_h, p, stamp);
      if (j < 0) break;  // every slot holds something at least as recent
      lock.unlock();
      copier.Copy(SlotPage(task.layer, ws, ws.cache_slot(j), h),
                  store_->Page(ws.host().page(task.layer, h, p)), store_->page_bytes());
      lock.lock();
      ws.slot_locked(l_h, j).last_use = stamp;
      ws.FinishLoadLocked(l_h, j);
      bytes += static_cast<int64_t>(store_->page_bytes());
      latencies.push_back(MonotonicSeconds() - task.issued_seconds);
    }
    lock.unlock();
  }
  lock.lock();
  --ws.active_tasks;
  ws.cv.notify_all();
  lock.unlock();
  ws.bytes_prefetched += bytes;
  std::lock_guard<std::mutex> l(latency_mu_);
  step_bytes_prefetched_ += bytes;
  for (double s : latencies) {
    if (latencies_.size() < kMaxLatencySamples) latencies_.push_back(s);
  }
}

SparseStepStats SparseKvCache::TakeStepStats() {
  SparseStepStats s = std::move(step_);
  step_ = SparseStepStats();
  std::lock_guard<std::mutex> lock(latency_mu_);
  s.prefetch_latencies_seconds = std::move(latencies_);
  latencies_.clear();
  s.bytes_prefetched = step_bytes_prefetched_;
  step_bytes_prefetched_ = 0;
  return s;
}

void SparseKvCache::MeasureRecall(int32_t layer, const WorkingSet& ws, int32_t pos,
                                  const float* q_row, absl::Span<const int32_t> page_begin,
                                  absl::Span<const int32_t> pages,
                                  absl::Span<const int32_t> tokens, int64_t list_base) {
  // Recall = exact attention mass on the attended keys. Every page before the current one is
  // on the host (prefilled or written back when full); the current page only on the device.
  const int32_t ps = page_size_;
  const int32_t hd = shape_.head_dim;
  const int32_t group = shape_.heads / shape_.kv_heads;
  const float scale = AttentionScale(hd);
  const auto* dev_base = static_cast<const char*>(device_.Layer(layer).base);
  const size_t page_bytes = store_->page_bytes();
  const int32_t current = pos / ps;
  const int32_t current_slot = ws.write_slot(current);
  // Keys in fp32, whatever the KV dtype: appends the first n keys of a page's bytes to `out`.
  auto append_keys = [&](const void* page, int32_t n, std::vector<float>* out) {
    const size_t at = out->size();
    out->resize(at + static_cast<size_t>(n) * hd);
    ConvertToF32(store_->dtype(), page, out->data() + at, static_cast<size_t>(n) * hd);
  };
  std::vector<float> all_keys, attended;
  for (int32_t h = 0; h < shape_.kv_heads; ++h) {
    all_keys.clear();
    attended.clear();
    for (int32_t p = 0; p <= current; ++p) {
      const void* base =
          p < current
              ? store_->Page(ws.host().page(layer, h, p))
              : dev_base + static_cast<size_t>(PoolPageId(ws, current_slot, h)) * page_bytes;
      append_keys(base, std::min(ps, pos - p * ps + 1), &all_keys);
    }
    const int64_t list = list_base + h;
    for (int32_t e = page_begin[list]; e < page_begin[list + 1]; ++e) {
      append_keys(dev_base + static_cast<size_t>(pages[e]) * page_bytes, tokens[e], &attended);
    }
    for (int32_t qh = 0; qh < group; ++qh) {
      const float* qv = q_row + static_cast<size_t>(h * group + qh) * hd;
      auto score = [&](const float* key) {
        float d = 0;
        for (int32_t c = 0; c < hd; ++c) d += qv[c] * key[c];
        return d * scale;
      };
      float mx = -INFINITY;
      for (size_t at = 0; at < all_keys.size(); at += hd) mx = std::max(mx, score(&all_keys[at]));
      double total = 0, kept = 0;
      for (size_t at = 0; at < all_keys.size(); at += hd)
        total += std::exp(score(&all_keys[at]) - mx);
      for (size_t at = 0; at < attended.size(); at += hd)
        kept += std::exp(score(&attended[at]) - mx);
      recall_->mass_sum += std::min(1.0, kept / total);
      ++recall_->samples;
    }
  }
}

}  // namespace specula
