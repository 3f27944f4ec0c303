// Sparse KV (docs/ARCHITECTURE.md §4): a sequence's KV is host pages, taken kGrowthTokens at a
// time as it decodes, with a device working set sized for its whole length; its prompt is
// prefilled layer-major (engine/generate/sparse_prefill.h), one such prefill per step. Only a
// decoding sequence is preempted (a prompt mid-prefill has layers half written).
#pragma once

#include <cstdint>
#include <map>
#include <memory>

#include "engine/generate/kv_manager.h"
#include "engine/generate/sparse_prefill.h"
#include "engine/model/transformer.h"

namespace specula {

class SparseKvManager final : public KvManager {
 public:
  // Host pages a sequence takes beyond what it has written, at admission and each time decode
  // reaches its last allocated page (tokens; rounded up to whole pages).
  static constexpr int64_t kGrowthTokens = 256;

  // `prefill_chunk_tokens` sizes the layer-major prefills' chunks. All outlive the manager.
  SparseKvManager(const KvResources& kv, SparseKvCache& cache, Transformer& model,
                  int32_t prefill_chunk_tokens)
      : KvManager(kv), cache_(cache), model_(model), prefill_chunk_tokens_(prefill_chunk_tokens) {}

  bool HasRoomFor(const GenerationRequest& request, int64_t total,
                  const KvRoom& reserved) const override;
  bool HasRoomToResume(const Sequence& seq, const KvRoom& reserved) const override;
  absl::Status Attach(Sequence& seq, bool resume) override;
  // Host pages, when the next token is past the allocated ones.
  KvRoom Growth(const Sequence& seq) const override;
  absl::Status Grow(Sequence& seq) override;
  bool Preemptible(const Sequence& seq) const override { return !seq.in_prefill(); }
  void Park(Sequence& seq) override;
  void PlanStep(StepPlan& plan) override { cache_.PlanStep(plan); }
  // The first prefill of the step takes the whole budget (times the layer count, in (layer,
  // chunk) units); later ones wait.
  int64_t ChoosePrefill(Sequence& seq, int64_t budget, ScheduledStep& step) override;
  void AddRow(Sequence& seq, int64_t n, bool prefill, ScheduledStep& step) const override;
  void EndStep(const ScheduledStep& step) override;
  void FinishStep(const ScheduledStep& step, SparseStepStats* stats) override;
  int64_t Advance(const ScheduledRow& row) override;
  // A failed prefetch gather: gathers are batched across the step's sequences, and a failed one
  // may leave any of their cache slots loading forever.
  absl::Status TakeStepError() override;
  void Release(Sequence& seq, bool kv_valid) override;
  KvStats Stats(const Sequence& seq) const override;

 private:
  // Tokens' host pages a sequence of at most `total` tokens takes when it has `tokens` to hold.
  static int64_t TokensNow(int64_t total, int64_t tokens);
  // Whether a sequence of at most `total` tokens that holds `tokens` now fits beside `reserved`
  // with `hit`.
  bool HasRoom(const PrefixCache::Peek& hit, int64_t total, int64_t tokens, int64_t budget_tokens,
               const KvRoom& reserved) const;
  int64_t HostPages(int64_t pages_per_head) const;  // over every layer and KV head
  // Its full pages to the prefix cache (its last page is partly on the device only); with
  // `park`, evictable, to be found again by Resume.
  void CacheKv(Sequence& seq, bool kv_valid, bool park);
  // Releases the working set of a sequence that holds one.
  void ReleaseWorkingSet(Sequence& seq);

  SparseKvCache& cache_;
  Transformer& model_;
  int32_t prefill_chunk_tokens_;
  // Layer-major prefills, by sequence id.
  std::map<uint64_t, std::unique_ptr<SparsePrefill>> prefills_;
  std::vector<int32_t> block_pages_;  // CacheKv's scratch
};

}  // namespace specula
