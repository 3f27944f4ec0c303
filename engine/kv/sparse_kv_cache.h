// The sparse KV cache with host-memory backing (docs/ARCHITECTURE.md §4, docs/SPARSE_KV.md): every
// sparse sequence's full KV lives in the HostKvStore; on the device (a few KV-pool blocks per
// sequence) it keeps sinks, the recent window and the selected pages. Per decode step and layer,
// Resolve scores the candidate pages with the real query, keeps the top `budget` pages per KV
// head, and attention reads only those. A PrefetchExecutor stages predicted pages ahead of use.
//
// Threading: every public method runs on the engine thread; prefetch threads only run tasks
// this class submits (RunTask) and meet the engine thread on each WorkingSet's mutex.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/backend.h"
#include "engine/common/check.h"
#include "engine/kv/host_kv_store.h"
#include "engine/kv/kv_pool.h"
#include "engine/kv/page_selector.h"
#include "engine/kv/prefetch_executor.h"
#include "engine/kv/sparse_options.h"
#include "engine/kv/working_set.h"

namespace specula {

// What decode attention found for a selected page: its copy landed (a hit), a prefetch's copy
// still in flight (late), or nothing (a miss).
enum class PageOutcome { kHit, kLate, kMissed };

struct SparseModelShape {
  int32_t layers = 0;
  int32_t heads = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
};

// One sparse sequence's rows in a forward batch.
struct SparseRows {
  WorkingSet* ws = nullptr;
  int32_t q_begin = 0;  // first row in the batch
  int32_t q_len = 0;    // 1 for decode
  int32_t start = 0;    // position of the first row
  bool prefill = false;
};

// Attention recall of the selected tokens, measured against exact attention (evaluation only).
struct RecallProbe {
  double mass_sum = 0;  // Σ over (row, query head, layer) of the attention mass attended
  int64_t samples = 0;
};

// What one decode attention reads, for tests that check slot contents (invariant 2).
struct AttendedPages {
  int32_t layer = 0;
  bool after = false;  // called once before the attention reads them and once after
  std::vector<const WorkingSet*> rows;
  std::vector<int32_t> page_begin;  // rows * kv_heads + 1 offsets into the lists below
  std::vector<int32_t> logical;     // page index within the sequence
  std::vector<int32_t> pool_pages;  // the device page read (KvPool layer page id)
  std::vector<int32_t> tokens;      // valid tokens read from it
};

class SparseKvCache {
 public:
  // `device` (the KV pool the working sets' slots come from) and `backend` must outlive it.
  static absl::StatusOr<std::unique_ptr<SparseKvCache>> Create(const SparseOptions& options,
                                                               const SparseModelShape& shape,
                                                               Backend& backend, KvPool& device);
  ~SparseKvCache();

  const SparseOptions& options() const { return options_; }
  int32_t page_size() const { return page_size_; }
  // The budget a request runs with (its override, else the configured one), in tokens.
  int64_t EffectiveBudget(int64_t requested_budget_tokens) const;
  // The working set of a request of `total_tokens` (prompt + max_tokens).
  WorkingSetGeometry Geometry(int64_t total_tokens, int64_t budget_tokens) const;

  // INVALID_ARGUMENT when `total_tokens` can never fit the host store or the working set can
  // never fit the device pool.
  absl::Status CheckCapacity(int64_t total_tokens, int64_t budget_tokens) const;
  bool HasRoomFor(int64_t total_tokens, int64_t budget_tokens) const;
  // Reserves host pages for `total_tokens` and the device slots; RESOURCE_EXHAUSTED when they
  // are not free now (nothing is held then). The first pages are `shared_pages` (block-major, as
  // HostKvStore::ReserveWithSharedPages takes them): a cached prefix whose KV and summaries are
  // in place, so prefill starts after it.
  absl::StatusOr<std::shared_ptr<WorkingSet>> Admit(int64_t total_tokens, int64_t budget_tokens,
                                                    int64_t prompt_tokens,
                                                    absl::Span<const PageId> shared_pages = {});
  // Stops new prefetches for the sequence and waits for those running, so its stats are final.
  void Quiesce(WorkingSet& ws);
  // Quiesces, then returns the sequence's host pages and device slots.
  void Release(WorkingSet& ws);
  bool Owns(const WorkingSet* ws) const;
  KvStats Stats(const WorkingSet& ws) const;

  // Starts a decode step for these decode rows (before any layer): predictions and residency are
  // stamped with the step number.
  void BeginDecodeStep(absl::Span<const SparseRows> rows);
  // Forward-pass hooks for one layer. q, k, v, out are the whole batch's matrices (RoPE done);
  // `rows` name the sparse sequences' rows in them.
  void Prefill(int32_t layer, absl::Span<const SparseRows> rows, const Mat& q, const Mat& k,
               const Mat& v, Mat* out);
  // `rows` are decode rows, contiguous in the batch.
  void Decode(int32_t layer, absl::Span<const SparseRows> rows, const Mat& q, const Mat& k,
              const Mat& v, Mat* out);
  // cross_layer: `queries` [rows][heads * head_dim] predict `layer`'s pages for this step.
  bool wants_layer_prediction() const;
  void PredictLayer(int32_t layer, absl::Span<const SparseRows> rows,
                    absl::Span<const float> queries);

  // What happened since the last call (hits, misses, stalls, prefetch latencies).
  SparseStepStats TakeStepStats();
  int64_t host_pages_used() const { return store_->used_pages(); }
  int64_t host_pages_capacity() const { return store_->capacity_pages(); }
  int64_t device_slots_used() const { return device_slots_used_; }
  const HostKvStore& store() const { return *store_; }
  HostKvStore& mutable_store() { return *store_; }
  const PageSelector& selector() const { return *selector_; }
  size_t index_bytes_per_page() const { return selector_->index_bytes_per_page(); }

  // Evaluation: when on, Decode also computes exact attention over the whole context and adds
  // the share of its mass on the attended tokens to the probe. Slow.
  // The probe reads KV from the host, so it needs a backend whose memory the host can read.
  void set_recall_probe(RecallProbe* probe) {
    CHECK(probe == nullptr || backend_.name() == "cpu")
        << "the recall probe runs on the CPU backend only";
    recall_ = probe;
  }
  void WaitForPrefetches() { executor_->WaitIdle(); }
  // Test hook, called on the engine thread right before and right after each decode attention.
  void set_attention_observer(std::function<void(const AttendedPages&)> observer) {
    observer_ = std::move(observer);
  }

 private:
  SparseKvCache(const SparseOptions& options, const SparseModelShape& shape, int32_t page_size,
                Backend& backend, KvPool& device);
  std::vector<std::shared_ptr<WorkingSet>>::const_iterator FindLive(const WorkingSet* ws) const;
  const std::shared_ptr<WorkingSet>& Owner(const WorkingSet& ws) const;
  bool wants_step_prediction() const;  // cross_step or both
  int32_t lh(int32_t layer, int32_t head) const { return layer * shape_.kv_heads + head; }
  // Address of slot `slot` of `head` in layer `layer`'s device pages.
  void* SlotPage(int32_t layer, const WorkingSet& ws, int32_t slot, int32_t head) const;
  // Updates the selector's summary of a full host page (engine thread).
  void SummarizePage(PageId id);
  int32_t PoolPageId(const WorkingSet& ws, int32_t slot, int32_t head) const;
  KvLayerView HostView() const;
  // Records compute_done_: the point copy streams wait for before writing slots.
  void RecordComputeDone();
  // Copies host pages [0, S) and the window into the device slots when decode starts.
  void LoadWindow(int32_t layer, WorkingSet& ws, int64_t prompt_tokens);
  // Moves pages leaving the window from the ring into cache slots (engine thread).
  void RetireWindowPages(int32_t layer, WorkingSet& ws, int32_t new_begin);
  // Picks this step's pages of (layer, head) for a decode row at `pos`, makes them resident
  // (per the miss policy) and appends the attended slots; `ranked` receives cross_step's
  // prediction for the next step.
  void Resolve(int32_t layer, int32_t head, WorkingSet& ws, int32_t pos, const float* queries,
               std::vector<int32_t>* attend_pages, std::vector<int32_t>* attend_tokens,
               std::vector<int32_t>* attend_logical, std::vector<int32_t>* predicted,
               std::vector<int32_t>* skipped);
  // Scores candidates [S, candidate_end) of (layer, head) and returns the top `k` (ascending).
  void TopCandidates(int32_t layer, int32_t head, const WorkingSet& ws, int32_t candidate_end,
                     const float* queries, int32_t k, std::vector<float>* scores,
                     std::vector<int32_t>* out) const;
  void SubmitQueries(int32_t layer, const std::shared_ptr<WorkingSet>& ws, uint64_t target_step,
                     const float* queries, int32_t candidate_end, bool urgent = false);
  // Prefetch threads: scores the task's pages if it carries queries, stages them, and waits for
  // them to land.
  void RunTask(PrefetchTask& task, Stream& stream);
  // Claims slots for the task's pages that are not resident and enqueues one gather for them
  // on `stream`; the event of that gather, or null when nothing was copied.
  std::shared_ptr<Event> StagePages(PrefetchTask& task, Stream& stream);
  // Enqueues copies_ on the compute stream; the slots in claimed_ become ready.
  void FillOnCompute(WorkingSet& ws);
  // Makes `page` of (layer, head) attendable per the miss policy (lock held): returns its cache
  // slot, or -1 to attend without it (skip). Sets what attention found and the time waited.
  int32_t MakeResident(int32_t layer, int32_t head, WorkingSet& ws, int32_t page,
                       std::unique_lock<std::mutex>& lock, PageOutcome* outcome, double* waited,
                       std::vector<int32_t>* skipped);
  // Enqueues the misses MakeResident collected as one gather on the compute stream.
  void FlushFetches(WorkingSet& ws);
  // Copies pages the decode rows just filled back to the host store and summarizes them.
  void WriteBackFullPages(int32_t layer, absl::Span<const SparseRows> rows);
  bool StaleLocked(const WorkingSet& ws, const PrefetchTask& task) const;
  void MeasureRecall(int32_t layer, const WorkingSet& ws, int32_t pos, const float* q_row,
                     absl::Span<const int32_t> page_begin, absl::Span<const int32_t> pages,
                     absl::Span<const int32_t> tokens, int64_t list_base);

  SparseOptions options_;
  SparseModelShape shape_;
  int32_t page_size_;
  Backend& backend_;
  KvPool& device_;
  std::unique_ptr<HostKvStore> store_;
  std::unique_ptr<PageSelector> selector_;
  // Engine-thread scratch for batched copies, reused so steady-state steps do not allocate.
  std::vector<PageCopy> copies_;
  std::vector<std::pair<int32_t, int32_t>> claimed_;  // (layer * kv_heads + head, cache slot)
  std::vector<PageCopy> fetches_;                     // misses of the sequence being resolved
  std::vector<PageId> written_back_;
  std::vector<float> q_host_;  // decode queries read back for selection
  // The compute stream's event after the latest decode attention: copy streams wait on it
  // before overwriting a slot that attention may have read.
  std::mutex compute_done_mu_;
  std::shared_ptr<Event> compute_done_;  // guarded by compute_done_mu_
  std::vector<float> key_scratch_;      // one page's keys in fp32 (SummarizePage)
  int64_t device_slots_used_ = 0;
  // Working sets by raw pointer -> owner, so tasks can hold a reference.
  std::vector<std::shared_ptr<WorkingSet>> live_;
  SparseStepStats step_;
  std::mutex latency_mu_;
  std::vector<double> latencies_;       // guarded by latency_mu_
  int64_t step_bytes_prefetched_ = 0;  // guarded by latency_mu_
  RecallProbe* recall_ = nullptr;
  std::function<void(const AttendedPages&)> observer_;
  std::unique_ptr<PrefetchExecutor> executor_;  // last: its threads stop first
};

}  // namespace specula
