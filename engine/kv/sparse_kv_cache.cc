#include "engine/kv/sparse_kv_cache.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "engine/common/capacity_error.h"
#include "engine/common/ceil_div.h"
#include "engine/common/check.h"
#include "engine/common/status_macros.h"

namespace specula {
namespace {

int32_t PagesOf(int64_t tokens, int32_t page_size) {
  return static_cast<int32_t>(CeilDiv(tokens, page_size));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SparseKvCache>> SparseKvCache::Create(const SparseOptions& given,
                                                                     const SparseModelShape& shape,
                                                                     Backend& backend,
                                                                     KvPool& device,
                                                                     HostKvStore& store) {
  RETURN_IF_ERROR(ValidateSparseOptions(given));
  // The CPU backend's memory is the host's (memory_is_host_readable): there a page read at use
  // costs nothing more than its slot.
  SparseOptions options = given;
  options.miss_policy = ResolveMissPolicy(given.miss_policy, backend.memory_is_host_readable());
  if (shape.layers <= 0 || shape.kv_heads <= 0 || shape.head_dim <= 0 ||
      shape.heads % shape.kv_heads != 0) {
    return absl::InvalidArgumentError("sparse kv cache: bad model shape");
  }
  CHECK(store.num_layers() == shape.layers && store.num_kv_heads() == shape.kv_heads &&
        store.head_dim() == shape.head_dim && store.page_size() == device.page_size() &&
        store.dtype() == device.dtype())
      << "the host store's pages must be the KV pool's (pages move between them as bytes)";
  std::unique_ptr<SparseKvCache> c(
      new SparseKvCache(options, shape, device.page_size(), backend, device));
  c->store_ = &store;
  ASSIGN_OR_RETURN(c->index_, SelectionIndex::Create(options.selector, backend,
                                                     store.capacity_pages(), shape.head_dim));
  c->prefetcher_ = std::make_unique<PagePrefetcher>(backend, options.prefetch_threads, shape.layers,
                                                    store.page_bytes());
  c->decode_ = std::make_unique<SparseDecodeKv>(options, shape, backend, device, store,
                                                *c->index_, *c->prefetcher_);
  return c;
}

SparseKvCache::SparseKvCache(const SparseOptions& options, const SparseModelShape& shape,
                             int32_t page_size, Backend& backend, KvPool& device)
    : options_(options), shape_(shape), page_size_(page_size), backend_(backend), device_(device) {
  // A block is handed out again only once no gather can still write it (a host wait only when
  // one is wanted back before its copies landed).
  device_.set_reuse_guard([this] { released_.Reap(/*wait=*/true); });
}

SparseKvCache::~SparseKvCache() {
  device_.set_reuse_guard(nullptr);
  if (prefetcher_ != nullptr) prefetcher_->Drain();
  while (!live_.empty()) Release(*live_.back());
  released_.Reap(/*wait=*/false);  // the streams are drained: every fence is done
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
    return NeverFitsError(absl::StrFormat(
        "prompt + max_tokens (%d tokens) can never fit: the host KV store holds %d "
        "tokens (kv_cache.host_capacity_tokens)",
        total_tokens, static_cast<int64_t>(store_->pages_per_head_capacity()) * page_size_));
  }
  const WorkingSetGeometry g = Geometry(total_tokens, budget_tokens);
  if (g.cache_slots > backend_.max_sparse_cache_slots()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a sparse budget of %d tokens with its prefetch slots needs %d cache pages per layer and "
        "KV head, more than this device's page selection holds (%d); lower the budget or "
        "sparse.prefetch_extra_tokens",
        EffectiveBudget(budget_tokens), g.cache_slots, backend_.max_sparse_cache_slots()));
  }
  const int32_t slots = g.slots_per_head();
  if (slots > device_.num_blocks()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a sparse working set with budget %d tokens needs %d KV cache pages of %d tokens "
        "(sinks + window + budget + prefetch slots), more than kv_cache.capacity_tokens holds "
        "(%d pages)",
        EffectiveBudget(budget_tokens), slots, page_size_, device_.num_blocks()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<WorkingSet>> SparseKvCache::Admit(
    int64_t total_tokens, int64_t budget_tokens, int64_t prompt_tokens,
    absl::Span<const PageId> shared_pages, int64_t allocate_tokens) {
  RETURN_IF_ERROR(CheckCapacity(total_tokens, budget_tokens));
  const WorkingSetGeometry g = Geometry(total_tokens, budget_tokens);
  if (device_.free_blocks() < g.slots_per_head()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("KV cache full: a sparse working set needs %d pages, %d of %d free",
                        g.slots_per_head(), device_.free_blocks(), device_.num_blocks()));
  }
  ASSIGN_OR_RETURN(HostKvSequence host, store_->ReserveWithSharedPages(shared_pages, total_tokens,
                                                                          allocate_tokens));
  absl::StatusOr<DeviceBuffer> state =
      backend_.Allocate(WorkingSet::DeviceStateBytes(g, host.pages_per_head()));
  if (!state.ok()) {
    store_->Release(host);
    return absl::Status(state.status().code(),
                        absl::StrFormat("sparse working set state: %s", state.status().message()));
  }
  auto blocks = device_.Allocate(g.slots_per_head());
  if (!blocks.ok()) {
    store_->Release(host);
    return blocks.status();
  }
  auto ws = std::make_shared<WorkingSet>(g, std::move(host), std::move(*blocks), prompt_tokens,
                                         std::move(*state));
  ws->stats.sparse = true;
  ws->stats.budget_tokens = EffectiveBudget(budget_tokens);
  device_slots_used_ += static_cast<int64_t>(g.slots_per_head()) * g.layers * g.kv_heads;
  live_.push_back(ws);
  return ws;
}

bool SparseKvCache::Owns(const WorkingSet* ws) const {
  return std::any_of(live_.begin(), live_.end(),
                     [&](const std::shared_ptr<WorkingSet>& p) { return p.get() == ws; });
}

void SparseKvCache::Release(WorkingSet& ws) {
  // Gathers only read host pages: they may go back to the store at once.
  store_->Release(ws.mutable_host());
  device_.Free(ws.device_blocks());
  const WorkingSetGeometry& g = ws.geometry();
  device_slots_used_ -= static_cast<int64_t>(g.slots_per_head()) * g.layers * g.kv_heads;
  auto it = std::find_if(live_.begin(), live_.end(),
                         [&](const std::shared_ptr<WorkingSet>& p) { return p.get() == &ws; });
  CHECK(it != live_.end());
  std::vector<std::shared_ptr<Event>> fences;
  prefetcher_->RecordFences(&fences);
  released_.Add(std::move(*it), std::move(fences));
  live_.erase(it);
}

void SparseKvCache::SummarizeLater(absl::Span<const PageId> pages) {
  if (index_->scoring() != PageScoring::kQuest) return;  // exact scoring reads the keys
  pending_summaries_.insert(pending_summaries_.end(), pages.begin(), pages.end());
}

void SparseKvCache::RunPendingSummaries(const StepPlan& plan) {
  if (summaries_planned_ == 0) return;
  const DeviceSpan<int32_t> pages = plan.Device(summaries_slice_);
  backend_.SummarizePages(PageSummaryArgs{pages, pages, store_->pool(), index_->summaries()});
  pending_summaries_.erase(pending_summaries_.begin(),
                           pending_summaries_.begin() + static_cast<ptrdiff_t>(summaries_planned_));
  summaries_planned_ = 0;
}

void SparseKvCache::PlanStep(StepPlan& plan) {
  released_.Reap(/*wait=*/false);
  // A step that plans them but does not run keeps them for the next.
  summaries_planned_ = pending_summaries_.size();
  if (summaries_planned_ > 0) summaries_slice_ = plan.Add<int32_t>(pending_summaries_);
  for (const std::shared_ptr<WorkingSet>& ws : live_) {
    if (ws->needs_init()) {
      ws->StageDeviceState(plan.StageTo(ws->device_state(), ws->device_state_bytes()));
    } else {
      ws->StageGrownPages([&](void* dst, size_t bytes) { return plan.StageTo(dst, bytes); });
    }
  }
}

void SparseKvCache::EndStep() { decode_->EndStep(); }

void SparseKvCache::FinishStep(SparseStepStats* out) {
  const double stall = prefetcher_->TakeStallSeconds();
  out->stall_seconds += stall;
  decode_->FinishStep(out, stall);
  prefetcher_->EndStep();
  prefetcher_->TakeLatencies(&out->prefetch_latencies_seconds);
}

}  // namespace specula
