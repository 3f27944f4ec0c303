#include "engine/kv/sparse_kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_format.h"
#include "engine/common/ceil_div.h"
#include "engine/common/check.h"
#include "engine/common/status_macros.h"
#include "engine/kv/top_pages.h"

namespace specula {
namespace {

int32_t PagesOf(int64_t tokens, int32_t page_size) {
  return static_cast<int32_t>(CeilDiv(tokens, page_size));
}

// Slot recency stamps, in half steps: a cross_step prediction for step t ranks below a real use
// at t and below a cross_layer prediction for t (computed from step t's own hidden state), which
// may therefore replace it; nothing replaces a page used or cross_layer-predicted at t for t.
uint64_t PredictStamp(uint64_t step) { return 2 * step; }
uint64_t UseStamp(uint64_t step) { return 2 * step + 1; }

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
  auto store = HostKvStore::Create(
      host, [&backend](size_t bytes) { return backend.AllocatePinnedHost(bytes); });
  if (!store.ok()) {
    return absl::Status(store.status().code(),
                        absl::StrFormat("sparse.host_capacity_tokens = %d: %s",
                                        options.host_capacity_tokens, store.status().message()));
  }
  c->store_ = std::move(*store);
  c->key_scratch_.resize(static_cast<size_t>(c->page_size_) * shape.head_dim);
  ASSIGN_OR_RETURN(c->selector_, MakePageSelector(options.selector, *c->store_));
  c->compute_done_ = backend.compute_stream().Record();
  SparseKvCache* self = c.get();
  c->executor_ = std::make_unique<PrefetchExecutor>(
      options.prefetch_threads, kMaxQueuedPredictions, backend,
      [self](PrefetchTask& task, Stream& stream) { self->RunTask(task, stream); });
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

absl::StatusOr<std::shared_ptr<WorkingSet>> SparseKvCache::Admit(
    int64_t total_tokens, int64_t budget_tokens, int64_t prompt_tokens,
    absl::Span<const PageId> shared_pages) {
  RETURN_IF_ERROR(CheckCapacity(total_tokens, budget_tokens));
  const WorkingSetGeometry g = Geometry(total_tokens, budget_tokens);
  if (device_.free_blocks() < g.slots_per_head()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "KV cache full: a sparse working set needs %d pages, %d of %d free", g.slots_per_head(),
        device_.free_blocks(), device_.num_blocks()));
  }
  ASSIGN_OR_RETURN(HostKvSequence host, store_->ReserveWithSharedPages(shared_pages, total_tokens));
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
  // A task ends only after its copies have landed, so no copy into the slots is in flight.
  ws.cv.wait(lock, [&] { return ws.active_tasks == 0; });
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
    }
    // Pages completed by this chunk become selectable. The summaries are built on the host from
    // the host store, which the compute stream has just written: wait for it once.
    if ((r.start / ps + 1) * ps <= end) {
      backend_.Synchronize();
      for (int32_t h = 0; h < shape_.kv_heads; ++h) {
        for (int32_t p = r.start / ps; (p + 1) * ps <= end; ++p) {
          SummarizePage(ws.host().page(layer, h, p));
        }
      }
    }
    for (int32_t h = 0; h < shape_.kv_heads; ++h) {
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
      // The prediction submitted below stages pages into slots: not before the compute stream
      // is done with what it enqueued so far (the window loads above, a freed sequence's reads).
      RecordComputeDone();
      const int32_t candidate_end = ws.geometry().window_begin(end / ps);
      if (wants_step_prediction() && candidate_end - ws.geometry().sink_pages > ws.geometry().budget_pages) {
        // The last prompt token's query predicts the first decode step's pages.
        ReadRowsToHost(backend_, q.Rows(r.q_begin + r.q_len - 1, 1), &q_host_);
        SubmitQueries(layer, Owner(ws), 1, q_host_.data(), candidate_end);
      }
    }
  }
}

void SparseKvCache::RecordComputeDone() {
  std::shared_ptr<Event> done = backend_.compute_stream().Record();
  std::lock_guard<std::mutex> lock(compute_done_mu_);
  compute_done_ = std::move(done);
}

void SparseKvCache::LoadWindow(int32_t layer, WorkingSet& ws, int64_t prompt_tokens) {
  const WorkingSetGeometry& g = ws.geometry();
  const int32_t ps = page_size_;
  const int32_t written = PagesOf(prompt_tokens, ps);  // pages holding prompt tokens
  const int32_t current = static_cast<int32_t>(prompt_tokens / ps);  // first decode token's page
  const int32_t window_begin = g.window_begin(current);
  // The budget covers every candidate: the first step would select them all anyway.
  const bool all_candidates = window_begin - g.sink_pages <= g.budget_pages;
  copies_.clear();
  claimed_.clear();
  std::lock_guard<std::mutex> lock(ws.mu);
  for (int32_t h = 0; h < shape_.kv_heads; ++h) {
    auto load = [&](int32_t page, int32_t slot) {
      copies_.push_back(
          {SlotPage(layer, ws, slot, h), store_->Page(ws.host().page(layer, h, page))});
    };
    for (int32_t p = 0; p < std::min(g.sink_pages, written); ++p) load(p, ws.sink_slot(p));
    for (int32_t p = window_begin; p < written; ++p) load(p, ws.ring_slot(p));
    if (!all_candidates) continue;
    for (int32_t p = g.sink_pages; p < window_begin; ++p) {
      const int32_t j = ws.ClaimLocked(lh(layer, h), p, std::numeric_limits<uint64_t>::max());
      CHECK_GE(j, 0);
      load(p, ws.cache_slot(j));
      claimed_.push_back({lh(layer, h), j});
      ws.stats.bytes_fetched += static_cast<int64_t>(store_->page_bytes());
      step_.bytes_fetched += static_cast<int64_t>(store_->page_bytes());
    }
  }
  FillOnCompute(ws);
  ws.window_begin = window_begin;
}

void SparseKvCache::FillOnCompute(WorkingSet& ws) {
  if (copies_.empty()) return;
  Stream& compute = backend_.compute_stream();
  compute.CopyPages(copies_, store_->page_bytes());
  if (claimed_.empty()) return;
  std::shared_ptr<Event> fill = compute.Record();
  for (const auto& [l_h, j] : claimed_) ws.FilledByComputeLocked(l_h, j, fill);
}

void SparseKvCache::RetireWindowPages(int32_t layer, WorkingSet& ws, int32_t new_begin) {
  if (ws.window_begin >= new_begin) return;
  copies_.clear();
  claimed_.clear();
  std::lock_guard<std::mutex> lock(ws.mu);
  for (int32_t p = ws.window_begin; p < new_begin; ++p) {
    for (int32_t h = 0; h < shape_.kv_heads; ++h) {
      // A cross_layer prediction may have staged it from the host already (it was written
      // back when it filled).
      if (ws.FindLocked(lh(layer, h), p) >= 0) continue;
      // Never evict a page the previous step used or one predicted for this step; a page
      // that finds no slot is fetched if it is ever selected.
      const int32_t j = ws.ClaimLocked(lh(layer, h), p, UseStamp(ws.decode_step - 1));
      if (j < 0) continue;
      ws.slot_locked(lh(layer, h), j).last_use = UseStamp(ws.decode_step - 1);
      copies_.push_back(
          {SlotPage(layer, ws, ws.cache_slot(j), h), SlotPage(layer, ws, ws.ring_slot(p), h)});
      claimed_.push_back({lh(layer, h), j});
    }
  }
  FillOnCompute(ws);
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

int32_t SparseKvCache::MakeResident(int32_t layer, int32_t head, WorkingSet& ws, int32_t page,
                                    std::unique_lock<std::mutex>& lock, PageOutcome* outcome,
                                    double* waited, std::vector<int32_t>* skipped) {
  const int32_t l_h = lh(layer, head);
  const bool skip = options_.miss_policy == MissPolicy::kSkip;
  // `fill` by value: the slot's own pointer may be reset by a claim while the lock is released.
  auto wait = [&](std::shared_ptr<Event> fill, bool host) {
    const double t0 = MonotonicSeconds();
    lock.unlock();
    if (host) {
      fill->Synchronize();
    } else {
      backend_.compute_stream().Wait(fill);
    }
    lock.lock();
    *waited += MonotonicSeconds() - t0;
  };
  // What attention finds when it needs the page: its copy landed (a hit), a prefetch's copy
  // still in flight (late), or nothing (a miss).
  int32_t j = ws.FindLocked(l_h, page);
  *outcome = j < 0                       ? PageOutcome::kMissed
             : ws.ReadableLocked(l_h, j) ? PageOutcome::kHit
                                         : PageOutcome::kLate;
  while (true) {
    j = ws.FindLocked(l_h, page);
    if (j >= 0) {
      WorkingSet::CacheSlot& s = ws.slot_locked(l_h, j);
      if (ws.ReadableLocked(l_h, j)) return j;
      CHECK(s.fill != nullptr) << "a claimed slot without a copy";
      if (skip) return -1;  // attend without it; its copy is on the way
      // Pinned, so the slot stays this page's; the compute stream then reads it after the copy.
      s.pin = ws.active_pin;
      wait(s.fill, /*host=*/false);
      return j;
    }
    if (skip) {
      skipped->push_back(page);
      return -1;
    }
    j = ws.ClaimLocked(l_h, page, std::numeric_limits<uint64_t>::max());
    if (j >= 0) {
      // Fetched on the compute stream before this layer's attention (FlushFetches).
      ws.slot_locked(l_h, j).pin = ws.active_pin;
      ws.FilledByComputeLocked(l_h, j, nullptr);
      fetches_.push_back({SlotPage(layer, ws, ws.cache_slot(j), head),
                          store_->Page(ws.host().page(layer, head, page))});
      ws.stats.bytes_fetched += static_cast<int64_t>(store_->page_bytes());
      step_.bytes_fetched += static_cast<int64_t>(store_->page_bytes());
      return j;
    }
    // Every slot this step does not use is still being filled by a prefetch: wait on the host
    // for one copy to land, then claim again (a prefetch may have mapped the page meanwhile).
    // (A host wait on a copy stream, not counted as a compute sync: rare, since C >= B.)
    const int32_t in_flight = ws.InFlightLocked(l_h);
    if (in_flight < 0) continue;  // they all landed since the claim failed: claim again
    wait(ws.slot_locked(l_h, in_flight).fill, /*host=*/true);
  }
}

void SparseKvCache::FlushFetches(WorkingSet& ws) {
  if (fetches_.empty()) return;
  const double t0 = MonotonicSeconds();
  backend_.compute_stream().CopyPages(fetches_, store_->page_bytes());
  const double waited = MonotonicSeconds() - t0;  // the copy itself on the CPU backend
  ws.stats.stall_seconds += waited;
  step_.stall_seconds += waited;
  fetches_.clear();
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
      PageOutcome outcome = PageOutcome::kMissed;
      double waited = 0;
      const int32_t j = MakeResident(layer, head, ws, p, lock, &outcome, &waited, skipped);
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

void SparseKvCache::WriteBackFullPages(int32_t layer, absl::Span<const SparseRows> rows) {
  // A page the new token completed goes back to the host store and becomes selectable.
  copies_.clear();
  written_back_.clear();
  for (const SparseRows& r : rows) {
    if (r.start % page_size_ != page_size_ - 1) continue;
    const WorkingSet& ws = *r.ws;
    const int32_t current = r.start / page_size_;
    for (int32_t h = 0; h < shape_.kv_heads; ++h) {
      const PageId id = ws.host().page(layer, h, current);
      copies_.push_back({store_->Page(id), SlotPage(layer, ws, ws.write_slot(current), h)});
      written_back_.push_back(id);
    }
  }
  if (copies_.empty()) return;
  backend_.compute_stream().CopyPages(copies_, store_->page_bytes());
  // The summaries are built on the host from the written-back keys.
  backend_.Synchronize();
  for (PageId id : written_back_) SummarizePage(id);
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

  WriteBackFullPages(layer, rows);

  // Resolve every (row, KV head) with the real queries: one read of the rows' span (q is a
  // column block of the QKV matrix, so row i starts at i * q.stride).
  ReadRowsToHost(backend_, q.Rows(first_row, static_cast<int64_t>(rows.size())), &q_host_);
  std::vector<int32_t> page_begin{0}, pages, tokens, logical, predicted, skipped;
  for (size_t i = 0; i < rows.size(); ++i) {
    const SparseRows& r = rows[i];
    WorkingSet& ws = *r.ws;
    PrefetchTask task;
    for (int32_t h = 0; h < shape_.kv_heads; ++h) {
      predicted.clear();
      skipped.clear();
      const float* queries = q_host_.data() + i * q.stride + static_cast<size_t>(h) * group * hd;
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
    FlushFetches(ws);  // the sequence's misses over all KV heads: one batched gather
    if (!task.pages.empty()) {
      task.ws = Owner(ws);
      task.layer = layer;
      task.target_step = ws.decode_step + 1;
      task.issued_seconds = MonotonicSeconds();
      executor_->Submit(std::move(task));
    }
    if (recall_ != nullptr) {
      MeasureRecall(layer, ws, r.start, q_host_.data() + i * q.stride, page_begin, pages, tokens,
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
  RecordComputeDone();  // a copy stream overwrites a slot only after this attention read it
  if (observer_) {
    backend_.Synchronize();  // the observer reads the output
    seen.after = true;
    observer_(seen);
  }

  // The attention is enqueued: its slots may be claimed again.
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

void SparseKvCache::RunTask(PrefetchTask& task, Stream& stream) {
  WorkingSet& ws = *task.ws;
  {
    std::lock_guard<std::mutex> lock(ws.mu);
    if (StaleLocked(ws, task)) return;
    ++ws.active_tasks;
  }
  if (!task.queries.empty()) {
    // Cross_layer: rank the candidates here, off the engine thread. Reads only summaries of
    // candidate pages, which cannot change until release.
    const int32_t group = shape_.heads / shape_.kv_heads;
    std::vector<float> scores;
    task.pages.assign(shape_.kv_heads, {});
    for (int32_t h = 0; h < shape_.kv_heads; ++h) {
      TopCandidates(task.layer, h, ws, task.candidate_end,
                    task.queries.data() + static_cast<size_t>(h) * group * shape_.head_dim,
                    ws.geometry().cache_slots, &scores, &task.pages[h]);
    }
  }
  const std::shared_ptr<Event> landed = StagePages(task, stream);
  int64_t copied = 0;
  if (landed != nullptr) {
    landed->Synchronize();  // this thread's own wait, to measure the latency; not the engine's
    copied = task.staged_pages;
  }
  const double latency = MonotonicSeconds() - task.issued_seconds;
  // Count before the task ends, so Quiesce (which waits for it) sees final stats.
  const int64_t bytes = copied * static_cast<int64_t>(store_->page_bytes());
  ws.bytes_prefetched += bytes;
  {
    std::lock_guard<std::mutex> l(latency_mu_);
    step_bytes_prefetched_ += bytes;
    for (int64_t i = 0; i < copied && latencies_.size() < kMaxLatencySamples; ++i) {
      latencies_.push_back(latency);
    }
  }
  std::lock_guard<std::mutex> lock(ws.mu);
  --ws.active_tasks;
  ws.cv.notify_all();
}

std::shared_ptr<Event> SparseKvCache::StagePages(PrefetchTask& task, Stream& stream) {
  WorkingSet& ws = *task.ws;
  const uint64_t stamp = task.urgent ? UseStamp(task.target_step) : PredictStamp(task.target_step);
  std::vector<PageCopy> copies;
  std::vector<std::pair<int32_t, int32_t>> claimed;  // (layer * kv_heads + head, cache slot)
  std::lock_guard<std::mutex> lock(ws.mu);
  if (StaleLocked(ws, task)) return nullptr;
  const int32_t heads = static_cast<int32_t>(task.pages.size());
  // Stamp the predicted pages already resident first, so staging the others cannot evict them.
  for (int32_t h = 0; h < heads; ++h) {
    for (int32_t p : task.pages[h]) {
      const int32_t j = ws.FindLocked(lh(task.layer, h), p);
      if (j < 0) continue;
      WorkingSet::CacheSlot& s = ws.slot_locked(lh(task.layer, h), j);
      s.last_use = std::max(s.last_use, stamp);
    }
  }
  for (int32_t h = 0; h < heads; ++h) {
    const int32_t l_h = lh(task.layer, h);
    for (int32_t p : task.pages[h]) {
      if (ws.FindLocked(l_h, p) >= 0) continue;
      const int32_t j = ws.ClaimLocked(l_h, p, stamp);
      if (j < 0) break;  // every slot holds something at least as recent
      ws.slot_locked(l_h, j).last_use = stamp;
      copies.push_back({SlotPage(task.layer, ws, ws.cache_slot(j), h),
                        store_->Page(ws.host().page(task.layer, h, p))});
      claimed.emplace_back(l_h, j);
    }
  }
  if (copies.empty()) return nullptr;
  // One batched gather for the whole (layer, step) prediction, after the compute stream has
  // finished reading the slots it reuses; the event says when the pages have landed.
  {
    std::lock_guard<std::mutex> l(compute_done_mu_);
    stream.Wait(compute_done_);
  }
  stream.CopyPages(copies, store_->page_bytes());
  std::shared_ptr<Event> landed = stream.Record();
  for (const auto& [l_h, j] : claimed) ws.FilledByCopyStreamLocked(l_h, j, landed);
  task.staged_pages = static_cast<int32_t>(copies.size());
  return landed;
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
