#include "engine/kv/sparse_options.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace specula {

const char* SpeculationModeName(SpeculationMode m) {
  switch (m) {
    case SpeculationMode::kNone: return "none";
    case SpeculationMode::kCrossStep: return "cross_step";
    case SpeculationMode::kCrossLayer: return "cross_layer";
    case SpeculationMode::kBoth: return "both";
  }
  return "?";
}

absl::StatusOr<SpeculationMode> ParseSpeculationMode(std::string_view name) {
  for (SpeculationMode m : {SpeculationMode::kNone, SpeculationMode::kCrossStep,
                            SpeculationMode::kCrossLayer, SpeculationMode::kBoth}) {
    if (name == SpeculationModeName(m)) return m;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown speculation mode '%s' (none|cross_step|cross_layer|both)", name));
}

const char* MissPolicyName(MissPolicy p) {
  switch (p) {
    case MissPolicy::kAuto:
      return "auto";
    case MissPolicy::kDefer:
      return "defer";
    case MissPolicy::kFetch:
      return "fetch";
  }
  return "?";
}

absl::StatusOr<MissPolicy> ParseMissPolicy(std::string_view name) {
  for (MissPolicy p : {MissPolicy::kAuto, MissPolicy::kDefer, MissPolicy::kFetch}) {
    if (name == MissPolicyName(p)) return p;
  }
  if (name == "skip") {
    // The old policy left out pages whose copy was late, so what a step attended depended on
    // copy timing; "defer" replaced it.
    return absl::InvalidArgumentError(
        "miss policy 'skip' was replaced by 'defer' (deterministic: it waits for late copies "
        "instead of leaving them out)");
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown miss policy '%s' (auto|defer|fetch)", name));
}

MissPolicy ResolveMissPolicy(MissPolicy p, bool backend_memory_is_host_memory) {
  if (p != MissPolicy::kAuto) return p;
  return backend_memory_is_host_memory ? MissPolicy::kFetch : MissPolicy::kDefer;
}

int32_t CorrectedPages(double miss_correction, int32_t budget_pages) {
  // Less a hair: 0.55 x 100 is 55.000000000000007 in doubles, and must stay 55.
  return static_cast<int32_t>(std::ceil(miss_correction * budget_pages - 1e-9));
}

absl::Status ValidateSparseOptions(const SparseOptions& o) {
  auto bad = [](const char* key, auto value, const char* want) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sparse.%s = %d: %s", key, value, want));
  };
  // Caps keep page and slot counts inside int32 (and far beyond any real context).
  constexpr int64_t kMaxTokens = int64_t{1} << 30;
  if (o.budget_tokens <= 0 || o.budget_tokens > kMaxTokens) {
    return bad("budget_tokens", o.budget_tokens, "must be in [1, 2^30]");
  }
  if (o.sink_tokens < 0 || o.sink_tokens > kMaxTokens) {
    return bad("sink_tokens", o.sink_tokens, "must be in [0, 2^30]");
  }
  if (o.recent_tokens < 0 || o.recent_tokens > kMaxTokens) {
    return bad("recent_tokens", o.recent_tokens, "must be in [0, 2^30]");
  }
  if (o.min_context_tokens < -1) {
    return bad("min_context_tokens", o.min_context_tokens, "must be >= 0 (or -1: 2x budget)");
  }
  if (o.prefetch_threads < 1 || o.prefetch_threads > 64) {
    return bad("prefetch_threads", o.prefetch_threads, "must be in [1, 64]");
  }
  if (o.prefetch_extra_tokens < -1 || o.prefetch_extra_tokens > kMaxTokens) {
    return bad("prefetch_extra_tokens", o.prefetch_extra_tokens,
               "must be in [0, 2^30] (or -1: budget / 2)");
  }
  if (!(o.miss_correction >= 0 && o.miss_correction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sparse.miss_correction = %g: must be in [0, 1]", o.miss_correction));
  }
  if (o.selector != "quest" && o.selector != "exact") {
    return absl::InvalidArgumentError(
        absl::StrFormat("sparse.selector = '%s': unknown selector (quest|exact)", o.selector));
  }
  return absl::OkStatus();
}

}  // namespace specula
