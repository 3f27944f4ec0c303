// A kind of KV a sequence can hold, and what the Scheduler asks of it (docs/ARCHITECTURE.md, the
// engine loop): whether a sequence fits now, its KV at admission and on resume, what it needs to
// grow before its next step, preemption (its KV parked in the prefix cache), its rows'
// attention metadata, and its KV handed to the prefix cache when it retires.
//
// Two kinds: DenseKvManager (KV-pool blocks) and SparseKvManager (host pages with a device working
// set). Each sequence has one for its whole life; dense-versus-sparse lives in them only.
// Engine thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/backend.h"
#include "engine/backend/step_plan.h"
#include "engine/generate/scheduled_step.h"
#include "engine/generate/sequence.h"
#include "engine/kv/host_kv_store.h"
#include "engine/kv/kv_pool.h"
#include "engine/kv/prefix_cache.h"
#include "engine/kv/sparse_kv_cache.h"

namespace specula {

// An amount of KV room: KV-pool blocks (dense blocks, sparse device slots) and host pages (one
// per layer and KV head).
struct KvRoom {
  int64_t pool_blocks = 0;
  int64_t host_pages = 0;
  bool empty() const { return pool_blocks == 0 && host_pages == 0; }
  KvRoom& operator+=(const KvRoom& o) {
    pool_blocks += o.pool_blocks;
    host_pages += o.host_pages;
    return *this;
  }
};

// What the managers share. All outlive them.
struct KvResources {
  Backend& backend;
  KvPool& pool;
  HostKvStore* host;  // null without kv_cache.host_capacity_tokens
  PrefixCache& prefix;
};

class KvManager {
 public:
  explicit KvManager(const KvResources& kv) : kv_(kv) {}
  virtual ~KvManager() = default;
  KvManager(const KvManager&) = delete;
  KvManager& operator=(const KvManager&) = delete;

  // Whether a new request of at most `total` tokens, or a preempted sequence, fits now beside
  // `reserved` (what running sequences grow by at the next step: one admitted into that room
  // would be the youngest, preempted at once).
  virtual bool HasRoomFor(const GenerationRequest& request, int64_t total,
                          const KvRoom& reserved) const = 0;
  virtual bool HasRoomToResume(const Sequence& seq, const KvRoom& reserved) const = 0;
  // Gives a new sequence its KV (the prefix cache's hit, then fresh room, evicting cache for it);
  // with `resume`, a preempted one KV for every token so far. On failure it holds nothing and
  // its hit is closed.
  virtual absl::Status Attach(Sequence& seq, bool resume) = 0;

  // What `seq` (holding KV) needs before its next step; empty when nothing.
  virtual KvRoom Growth(const Sequence& seq) const = 0;
  // Evicts cache until `need` is free; whether it is.
  bool MakeRoom(const KvRoom& need);
  // Takes the growth (made room for). An error is an allocation failure: the sequence fails.
  virtual absl::Status Grow(Sequence& seq) = 0;
  // Whether `seq` (holding KV) may be preempted now, and its KV given back: parked in the prefix
  // cache (evictable, found again by Resume) and freed. The caller then calls seq.Preempt().
  virtual bool Preemptible(const Sequence& seq) const = 0;
  virtual void Park(Sequence& seq) = 0;

  // The step: the KV's own plan (before the rows), the prompt tokens of `budget` that `seq`'s
  // prefill takes (0: it waits), a row's attention metadata, what ends after the forward pass
  // is enqueued and what it did once read back, and how many tokens' KV a row wrote.
  virtual void PlanStep(StepPlan& plan) { (void)plan; }
  virtual int64_t ChoosePrefill(Sequence& seq, int64_t budget, ScheduledStep& step) = 0;
  virtual void AddRow(Sequence& seq, int64_t n, bool prefill, ScheduledStep& step) const = 0;
  virtual void EndStep(const ScheduledStep& step) { (void)step; }
  virtual void FinishStep(const ScheduledStep& step, SparseStepStats* stats) {
    (void)step;
    (void)stats;
  }
  virtual int64_t Advance(const ScheduledRow& row) = 0;
  // The error every sequence holding this kind of KV fails with after the step (their KV is not
  // to be trusted), or OK.
  virtual absl::Status TakeStepError() { return absl::OkStatus(); }

  // Hands a retiring sequence's KV to the prefix cache (unless `kv_valid` is false: the step that
  // wrote it failed) and frees it. What the KV cache did for it, for its last output.
  virtual void Release(Sequence& seq, bool kv_valid) = 0;
  virtual KvStats Stats(const Sequence& seq) const {
    (void)seq;
    return KvStats();
  }

 protected:
  // The prefix cache's hit of a new sequence (its prompt) or a resumed one (every token so far).
  absl::Status BeginHit(Sequence& seq, bool sparse, bool resume);
  // Closes a hit whose sequence got no KV.
  void AbandonHit(Sequence& seq);
  static std::vector<int32_t> TokensOf(const Sequence& seq, int64_t n);
  int32_t page_size() const { return kv_.pool.page_size(); }

  KvResources kv_;
};

}  // namespace specula
