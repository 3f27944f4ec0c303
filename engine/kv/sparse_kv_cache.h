// The sparse KV cache with host-memory backing (docs/ARCHITECTURE.md §4, docs/SPARSE_KV.md):
// every sparse sequence's full KV lives in the HostKvStore; on the device (a few KV-pool blocks
// per sequence) it keeps sinks, the recent window and the selected pages. Selection, residency
// and prefetch planning run on the device (engine/backend/sparse_ops.h); this class owns the pieces
// and the sequences' admission and release:
//   HostKvStore      the host pages (pinned on a GPU; the engine's, shared with sessions);
//   SelectionIndex   the device-resident page summaries (quest) the scoring reads;
//   PagePrefetcher   the copy streams that load staged pages;
//   SparseDecodeKv   the decode rows behind the model's KV seam;
//   WorkingSet       one sequence: host pages, device slots and its device state.
// (Layer-major prefill, engine/generate/sparse_prefill.h, uses the same pieces.)
//
// Engine thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/backend/backend.h"
#include "engine/backend/step_plan.h"
#include "engine/kv/host_kv_store.h"
#include "engine/kv/keep_until_done.h"
#include "engine/kv/kv_pool.h"
#include "engine/kv/page_prefetcher.h"
#include "engine/kv/selection_index.h"
#include "engine/kv/sparse_decode.h"
#include "engine/kv/sparse_options.h"
#include "engine/kv/working_set.h"

namespace specula {

class SparseKvCache {
 public:
  // `device` (the KV pool the working sets' slots come from), `backend` and `store` (the host
  // pages, of the pool's page layout and dtype; shared with the prefix cache) must outlive it.
  // `options.miss_policy` auto is resolved for `backend` (options() holds what runs).
  static absl::StatusOr<std::unique_ptr<SparseKvCache>> Create(const SparseOptions& options,
                                                               const SparseModelShape& shape,
                                                               Backend& backend, KvPool& device,
                                                               HostKvStore& store);
  ~SparseKvCache();

  const SparseOptions& options() const { return options_; }
  const SparseModelShape& shape() const { return shape_; }
  int32_t page_size() const { return page_size_; }
  // The budget a request runs with (its override, else the configured one), in tokens.
  int64_t EffectiveBudget(int64_t requested_budget_tokens) const;
  // The working set of a request of `total_tokens` (prompt + max_tokens).
  WorkingSetGeometry Geometry(int64_t total_tokens, int64_t budget_tokens) const;

  // RESOURCE_EXHAUSTED marked never-fits (engine/common/capacity_error.h) when `total_tokens`
  // can never fit the host store; INVALID_ARGUMENT when the budget's working set can never fit
  // the device (a smaller budget would).
  absl::Status CheckCapacity(int64_t total_tokens, int64_t budget_tokens) const;
  // Reserves host pages for `total_tokens`, the device slots and the device state;
  // RESOURCE_EXHAUSTED when they are not free now (nothing is held then). The first pages are
  // `shared_pages` (block-major, as HostKvStore::ReserveWithSharedPages takes them): a cached
  // prefix whose KV and summaries are in place, so prefill starts after it.
  // With `allocate_tokens` >= 0 only the host pages of its first `allocate_tokens` are taken
  // now (the page table and device state are sized for `total_tokens`); Grow takes more.
  absl::StatusOr<std::shared_ptr<WorkingSet>> Admit(int64_t total_tokens, int64_t budget_tokens,
                                                    int64_t prompt_tokens,
                                                    absl::Span<const PageId> shared_pages = {},
                                                    int64_t allocate_tokens = -1);
  // Host pages for the working set's first `tokens` (HostKvStore::Grow); the device's page
  // table is updated by the next PlanStep.
  absl::Status Grow(WorkingSet& ws, int64_t tokens) {
    return store_->Grow(ws.mutable_host(), tokens);
  }
  // Returns the sequence's host pages and device slots, without waiting: prefetch copies into
  // its slots and state may still be in flight, so the state is kept, and the slots are handed
  // out again (KvPool's reuse guard), only once the copy streams have passed the release.
  void Release(WorkingSet& ws);
  bool Owns(const WorkingSet* ws) const;
  KvStats Stats(const WorkingSet& ws) const { return ws.stats; }

  // Host pages written from outside the sparse cache (a dense session's KV offloaded between
  // turns): their quest summaries are computed at the start of the next step that runs, before
  // anything can score them. Their copies must be enqueued on the compute stream already.
  void SummarizeLater(absl::Span<const PageId> pages);

  // --- Per step ---
  // Stages the device state of newly admitted working sets into `plan`; call first.
  void PlanStep(StepPlan& plan);
  // After the plan's upload, before the step's other operations: the summaries SummarizeLater
  // asked for.
  void RunPendingSummaries(const StepPlan& plan);
  SparseDecodeKv& decode() { return *decode_; }
  // After every operation of the step: enqueues the decode counters' readback.
  void EndStep();
  // After the step's synchronization: what the step did, into `out` and each request's stats.
  void FinishStep(SparseStepStats* out);

  int64_t host_pages_used() const { return store_->used_pages(); }
  int64_t host_pages_capacity() const { return store_->capacity_pages(); }
  int64_t device_slots_used() const { return device_slots_used_; }
  const HostKvStore& store() const { return *store_; }
  HostKvStore& mutable_store() { return *store_; }
  SelectionIndex& index() { return *index_; }
  PagePrefetcher& prefetcher() { return *prefetcher_; }
  KvPool& device() { return device_; }
  Backend& backend() { return backend_; }
  size_t index_bytes_per_page() const {
    return index_->index_bytes_per_page(store_->page_bytes() / 2);
  }

  // Evaluation: when on, decode also computes exact attention over the whole context and adds
  // the share of its mass on the attended tokens to the probe (a backend whose memory the host
  // reads in place: the CPU's; slow).
  void set_recall_probe(RecallProbe* probe) {
    CHECK(probe == nullptr || backend_.memory_is_host_readable())
        << "the recall probe reads backend memory in place (the CPU backend)";
    decode_->set_recall_probe(probe);
  }
  // Tests: waits until every staged page has landed.
  void WaitForPrefetches() { prefetcher_->Drain(); }
  // Test hook, called right before and right after each decode attention (CPU backend).
  void set_attention_observer(std::function<void(const AttendedPages&)> observer) {
    decode_->set_attention_observer(std::move(observer));
  }

 private:
  SparseKvCache(const SparseOptions& options, const SparseModelShape& shape, int32_t page_size,
                Backend& backend, KvPool& device);

  SparseOptions options_;
  SparseModelShape shape_;
  int32_t page_size_;
  Backend& backend_;
  KvPool& device_;
  HostKvStore* store_ = nullptr;  // not owned
  std::unique_ptr<SelectionIndex> index_;
  std::unique_ptr<PagePrefetcher> prefetcher_;
  std::unique_ptr<SparseDecodeKv> decode_;
  int64_t device_slots_used_ = 0;
  std::vector<std::shared_ptr<WorkingSet>> live_;
  std::vector<PageId> pending_summaries_;
  PlanSlice<int32_t> summaries_slice_;  // this step's share of them
  size_t summaries_planned_ = 0;
  // Released working sets whose state and slots gathers may still write, each until every copy
  // stream has passed its release.
  KeepUntilDone released_;
};

}  // namespace specula
