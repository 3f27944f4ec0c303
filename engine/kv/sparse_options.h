// Options and statistics of the sparse KV cache (docs/ARCHITECTURE.md §4), shared by the engine,
// the server config and the API. Plain data: no threads, no device.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace specula {

// Which predictors feed the prefetch executor.
//   cross_step:  the query of layer l at step t ranks layer l's pages; the pages just below the
//                budget's cut are staged for step t+1 (consecutive steps' sets overlap).
//   cross_layer: layer l's input through layer l+1's norm and W_q ranks layer l+1's pages
//                while layer l computes.
enum class SpeculationMode { kNone, kCrossStep, kCrossLayer, kBoth };
// What a selected page that is not on the device does at use (docs/SPARSE_KV.md, "Miss policies"):
//   defer: before a layer selects, the copies staged for it in earlier steps have landed (the
//          compute stream waits for any still in flight: stall time), so what a step attends
//          never depends on copy timing. A selected page with no device slot is staged for the
//          next step and left out of this one, unless it ranks among the best miss_correction
//          share of its selection: then it is read from the host store at use (a correction).
//          One whose copy was staged in this step (cross_layer) and is still in flight is late:
//          attention waits for it.
//   fetch: read from the host store at use, over the bus (exact: the dense result over the
//          selection; on a GPU, a synchronous read at a fraction of the bus's bulk rate).
//   auto:  defer where the device reads host memory over a bus (a GPU), fetch where the host
//          store is the device's own memory (the CPU backend: a page read at use costs what its
//          slot would, and fetch keeps every selected page). SparseKvCache resolves it.
enum class MissPolicy { kAuto, kDefer, kFetch };

const char* SpeculationModeName(SpeculationMode m);  // none|cross_step|cross_layer|both
absl::StatusOr<SpeculationMode> ParseSpeculationMode(std::string_view name);
const char* MissPolicyName(MissPolicy p);  // auto|defer|fetch
absl::StatusOr<MissPolicy> ParseMissPolicy(std::string_view name);
// The policy that runs: `p`, or for kAuto the one that suits a backend whose memory is (true) or
// is not (false) host memory.
MissPolicy ResolveMissPolicy(MissPolicy p, bool backend_memory_is_host_memory);

struct SparseOptions {
  bool enabled = false;
  // Selected pages per (layer, KV head), in tokens (rounded up to whole pages); sinks and the
  // recent window come on top of it.
  int64_t budget_tokens = 2048;
  int32_t sink_tokens = 16;     // first tokens, always attended (rounded up to pages)
  int32_t recent_tokens = 256;  // last tokens, always attended (rounded up to pages)
  std::string selector = "quest";  // quest | exact
  SpeculationMode speculation = SpeculationMode::kCrossStep;
  MissPolicy miss_policy = MissPolicy::kAuto;
  // Under defer: a missed page among the best-ranked miss_correction x budget pages of its
  // selection is read from host memory at once (a correction) instead of waiting a step: the
  // pages a moved query needs most. 0 corrects nothing; 1 every miss (fetch's misses). [0, 1].
  // Ignored under fetch, which reads every miss.
  double miss_correction = 0.75;
  // Requests whose prompt + max_tokens is below this run dense; -1 = 2 * budget_tokens.
  int64_t min_context_tokens = -1;
  int32_t prefetch_threads = 1;
  // Extra device slots per (layer, KV head) that cross_step fills with the pages ranked just
  // below the budget, in tokens (rounded up to pages); -1 = half the request's budget (measured:
  // a quarter gave a 0.88 cross_step hit rate at a 25% budget, half 0.93; docs/BENCHMARKS.md).
  int64_t prefetch_extra_tokens = -1;

  int64_t effective_min_context_tokens() const {
    return min_context_tokens >= 0 ? min_context_tokens : 2 * budget_tokens;
  }
  // For a request running with `budget` tokens.
  int64_t effective_prefetch_extra_tokens(int64_t budget) const {
    return prefetch_extra_tokens >= 0 ? prefetch_extra_tokens : budget / 2;
  }
  bool operator==(const SparseOptions&) const = default;
};

// How many of a selection of `budget_pages` pages defer corrects (the best-ranked ones):
// ceil(miss_correction x budget_pages).
int32_t CorrectedPages(double miss_correction, int32_t budget_pages);

// INVALID_ARGUMENT naming the `sparse.<key>` at fault.
absl::Status ValidateSparseOptions(const SparseOptions& options);

// Per-request override (GenerateRequest.sparse).
enum class SparseMode { kDefault, kDense, kSparse };
struct SparseRequestOptions {
  SparseMode mode = SparseMode::kDefault;
  int64_t budget_tokens = 0;  // 0 = the server's sparse.budget_tokens
};

// What the sparse cache did for one request (the final response's kv_stats). Counted over
// selected pages only (sinks and the recent window are always resident and never counted).
struct KvStats {
  bool sparse = false;          // false: the request ran dense and the counters are 0
  int64_t budget_tokens = 0;    // the budget it ran with
  int64_t pages_hit = 0;     // selected pages resident (copy complete) when attention needed them
  int64_t pages_missed = 0;  // selected pages absent then: fetched (fetch) or deferred (defer)
  // Selected pages whose prefetch copy was still in flight when their layer selected them: read
  // from the host store under fetch; waited for under defer (there only this step's cross_layer
  // copies can be: the earlier steps' are waited for before selecting).
  int64_t pages_late = 0;
  // Missed pages defer read from host memory at once (sparse.miss_correction); also counted in
  // pages_missed and bytes_fetched.
  int64_t pages_corrected = 0;
  int64_t bytes_prefetched = 0; // bytes the prefetch executor copied for this request
  int64_t bytes_fetched = 0;    // bytes copied synchronously on misses
  double stall_seconds = 0;     // decode time spent waiting for pages
  int64_t pages_selected() const { return pages_hit + pages_missed + pages_late; }
  double hit_rate() const {
    const int64_t n = pages_selected();
    return n == 0 ? 1.0 : static_cast<double>(pages_hit) / static_cast<double>(n);
  }
};

// What the sparse cache did during one engine step, over all requests (for metrics).
struct SparseStepStats {
  int64_t pages_hit = 0;
  int64_t pages_missed = 0;
  int64_t pages_late = 0;
  int64_t pages_corrected = 0;
  int64_t bytes_prefetched = 0;
  int64_t bytes_fetched = 0;
  double stall_seconds = 0;
  // Issue -> ready time of each prefetch copy that completed since the previous step.
  std::vector<double> prefetch_latencies_seconds;
};

}  // namespace specula
