// Which running sequences each step runs, and their KV over the KV managers: admission, growth
// and preemption in one loop (docs/ARCHITECTURE.md, the engine loop; docs/SESSIONS.md,
// preemption).
//
// Decode first: every running sequence gets its token each step, so the time between tokens
// stays bounded while long prompts are prefilled a chunk at a time, in admission order within
// the step's prefill budget. A sequence whose next token needs more KV than is free takes it
// from the youngest running sequences of its kind, which are preempted: their KV parked in the
// prefix cache, resumed oldest first (before anything new starts, none passed over) by
// prefilling what eviction did not spare.
//
// Engine thread only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "engine/generate/kv_manager.h"
#include "engine/generate/scheduled_step.h"
#include "engine/generate/sequence.h"

namespace specula {

class Scheduler {
 public:
  struct Options {
    int32_t max_running = 64;  // most sequences in one step
    int32_t prefill_chunk_tokens = 512;
    // Prefill budget while no sequence decodes; 0: prefill_chunk_tokens.
    int32_t solo_prefill_chunk_tokens = 0;
  };
  // `managers`: every kind of KV, in the order the ModelRunner lays out their rows (dense rows
  // first). They must outlive every call; the scheduler's destructor does not call them.
  Scheduler(const Options& options, std::vector<KvManager*> managers)
      : options_(options), managers_(std::move(managers)) {}

  // OK when a new sequence may start now: a running slot is free and no preempted sequence waits
  // (they come back first); else RESOURCE_EXHAUSTED saying which.
  absl::Status CheckAdmission() const;
  bool CanAdmit() const;  // CheckAdmission().ok(), without building a status
  // Whether a request of at most `total` tokens on `kv` would be admitted now.
  bool HasRoomFor(const GenerationRequest& request, int64_t total, const KvManager& kv) const;
  // Gives the sequence its KV on `kv` and runs it from the next step.
  absl::Status Admit(std::unique_ptr<Sequence> seq, KvManager& kv);

  // Before each step's rows: preempted sequences that fit again get their KV back, then every
  // sequence's growth (preempting as above). A sequence whose allocation fails (room was there)
  // ends with an output carrying the error.
  void MakeRoom(std::vector<SequenceOutput>* outputs);
  // The KV managers' parts of the step: their plans before the rows, what ends once the
  // forward pass is enqueued, and what they did once it is read back.
  void PlanKv(StepPlan& plan);
  void EndKvStep(const ScheduledStep& step);
  void FinishKvStep(const ScheduledStep& step, SparseStepStats* stats);
  // The step's rows (the KV managers' plans are in the runner's plan already). Reused: a steady
  // step allocates nothing.
  ScheduledStep& ChooseRows();
  // After the step is read back: how many tokens' KV the row wrote (and the sequence advanced).
  int64_t Advance(const ScheduledRow& row);
  // Fails every sequence whose KV manager reports an error for the step (an output each with
  // it); their ids, to retire with their KV discarded.
  absl::flat_hash_set<uint64_t> FailOnStepErrors(std::vector<SequenceOutput>* outputs);

  // The output that ends `seq` with `error`, and a final output's kv_stats.
  SequenceOutput FailedOutput(const Sequence& seq, absl::Status error) const;
  KvStats FinalKvStats(const Sequence& seq) const;
  // Frees a sequence's KV (handed to the prefix cache unless `kv_valid` is false) and forgets it.
  void Retire(uint64_t id, bool kv_valid = true);
  Sequence* Find(uint64_t id) const;  // null when it is not running

  bool empty() const { return running_.empty(); }
  size_t size() const { return running_.size(); }
  int64_t preemptions() const { return preemptions_; }
  // Tokens resumed sequences found still cached (not recomputed), cumulative.
  int64_t resumed_cached_tokens() const { return resumed_cached_tokens_; }

 private:
  struct Running {
    std::unique_ptr<Sequence> seq;
    KvManager* kv = nullptr;
  };
  bool HasPreempted() const;
  // What running sequences grow by at the next step, over every manager, or over `kv`'s only.
  KvRoom Reserved(const KvManager* kv = nullptr) const;
  void ResumePreempted(std::vector<SequenceOutput>* outputs);
  void Grow(KvManager& kv, std::vector<SequenceOutput>* outputs);
  void Preempt(Running& victim);
  int64_t PrefillBudget() const;
  // Prefills in admission order within the budget: each sequence's share of it.
  void ChoosePrefills();

  Options options_;
  std::vector<KvManager*> managers_;
  std::map<uint64_t, Running> running_;  // ordered by id: admission order
  int64_t preemptions_ = 0;
  int64_t resumed_cached_tokens_ = 0;
  // ChooseRows' step and scratch, kept across steps.
  ScheduledStep step_;
  std::vector<std::pair<Running*, int64_t>> prefills_;
  std::vector<uint64_t> failed_;
};

}  // namespace specula
