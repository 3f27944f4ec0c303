// What the serving engine reports as it runs, for metrics and request logs. The server implements
// this with Prometheus; tests implement it to count events.
//
// Threading: every method is called on the engine thread, between steps or while dispatching a
// step's outputs. Implementations must be cheap and must not block or call back into the Engine.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/generate/sequence.h"
#include "engine/kv/prefix_cache.h"
#include "engine/kv/sparse_options.h"

namespace specula {

// One request's life, reported once when it leaves the engine (finished, cancelled, failed).
struct RequestSummary {
  std::string request_id;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // of prompt_tokens, whose KV came from the prefix cache
  FinishReason finish = FinishReason::kNone;  // kNone when it failed or was never admitted
  absl::StatusCode code = absl::StatusCode::kOk;  // what the client's stream ends with
  std::string error;  // the status message when `code` is not OK: why it failed
  double queue_seconds = 0;   // submit -> admission (or -> leaving, if never admitted)
  double ttft_seconds = -1;   // submit -> first token; -1 when no token was produced
  double e2e_seconds = 0;     // submit -> leaving
  // What the KV cache did for it; unset when it was never admitted.
  std::optional<KvStats> kv_stats;
};

// A request moved from the waiting queue into the running batch.
struct Admission {
  std::string request_id;
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // of prompt_tokens, whose KV came from the prefix cache
  double queue_seconds = 0;          // submit -> admission
};

// One forward pass of the continuous-batching loop.
struct StepSummary {
  int32_t decode_rows = 0;      // sequences that decoded one token
  int32_t prefill_tokens = 0;   // prompt tokens processed in this pass
  double seconds = 0;           // wall time of the pass
  // Of `seconds`, the engine thread blocked waiting for the device (the step's readback); the
  // rest is host work (scheduling, planning, launching, accepting tokens).
  double device_wait_seconds = 0;
  // Sequences whose prompt ran in this pass (StepStats::prefill_rows, failed ones included): a
  // layer-major sparse prefill's units count here while its tokens count in prefill_tokens
  // only at its end.
  int32_t prefill_rows = 0;
};

// Queue and cache occupancy, reported after every change the engine thread makes.
struct EngineLoad {
  int32_t waiting = 0;
  int32_t running = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_total = 0;
  int32_t kv_page_size = 0;  // tokens per block
  // Sparse KV cache (all 0 when sparse.enabled is false): host pages (one layer's and one KV
  // head's kv_page_size tokens) held by requests, the host store's size, and KV pool pages held
  // by sparse working sets on the device.
  int64_t host_pages_used = 0;
  int64_t host_pages_capacity = 0;
  int64_t device_slots_used = 0;
  // The prefix cache (docs/SESSIONS.md): KV-pool blocks and host pages cached but held by no
  // request or session (free for admission, not counted as used above); sessions and the KV
  // bytes their last turns keep; pages evicted so far, by EvictionReason.
  int64_t kv_blocks_cached = 0;
  int64_t host_pages_cached = 0;
  int64_t sessions = 0;
  int64_t session_kv_bytes = 0;
  std::array<int64_t, kEvictionReasons> evicted_pages = {};
  int64_t preemptions = 0;  // running requests preempted for KV room so far
  uint64_t steps = 0;       // forward passes run so far: progress, for the watchdog
};

// One request as the engine last published it (Engine::Requests), for an operator asking what
// a stuck engine holds.
struct RequestBrief {
  std::string request_id;
  const char* state = "";  // "submitted", "waiting" or "running"
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  absl::Time submitted;
};

class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  // A request moved from the waiting queue into the running batch.
  virtual void OnAdmitted(const Admission& admission) {}
  // A request produced its first token (time to first token, from submission).
  virtual void OnFirstToken(double ttft_seconds) {}
  // A request produced a token after its first: the time since its previous token.
  virtual void OnNextToken(double tbt_seconds) {}
  virtual void OnStep(const StepSummary& step) {}
  // After OnStep, for a step in which the sparse KV cache selected, copied or waited for pages.
  virtual void OnSparseStep(const SparseStepStats& sparse) {}
  virtual void OnFinished(const RequestSummary& summary) {}
  // Once, on the engine thread, when the device failed (Backend::device_fault): the engine has
  // failed its requests with `fault` and fails every later one; the process should restart.
  virtual void OnDeviceFault(const absl::Status& fault) {}
  virtual void OnLoad(const EngineLoad& load) {}
};

// Forwards every event to each observer in order (e.g. metrics, then request logs).
class ObserverList : public EngineObserver {
 public:
  explicit ObserverList(std::vector<EngineObserver*> observers)
      : observers_(std::move(observers)) {}
  void OnAdmitted(const Admission& admission) override {
    for (auto* o : observers_) o->OnAdmitted(admission);
  }
  void OnFirstToken(double ttft_seconds) override {
    for (auto* o : observers_) o->OnFirstToken(ttft_seconds);
  }
  void OnNextToken(double tbt_seconds) override {
    for (auto* o : observers_) o->OnNextToken(tbt_seconds);
  }
  void OnStep(const StepSummary& step) override {
    for (auto* o : observers_) o->OnStep(step);
  }
  void OnSparseStep(const SparseStepStats& sparse) override {
    for (auto* o : observers_) o->OnSparseStep(sparse);
  }
  void OnFinished(const RequestSummary& summary) override {
    for (auto* o : observers_) o->OnFinished(summary);
  }
  void OnDeviceFault(const absl::Status& fault) override {
    for (auto* o : observers_) o->OnDeviceFault(fault);
  }
  void OnLoad(const EngineLoad& load) override {
    for (auto* o : observers_) o->OnLoad(load);
  }

 private:
  std::vector<EngineObserver*> observers_;
};

}  // namespace specula
