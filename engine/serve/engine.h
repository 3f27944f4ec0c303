// The serving engine: a Generator driven by its own thread in a continuous-batching loop, with a
// bounded waiting queue in front (docs/ARCHITECTURE.md §3). Every step it retires cancelled and
// expired requests, admits waiting ones in arrival order while the running batch and the KV cache
// have room, runs one forward pass (prefill chunks mixed with one decode token for every running
// request) and hands the outputs to each request's RequestStream.
//
// Threading: Submit, Cancel, StopAccepting, WaitIdle, load() and generator()'s immutable parts
// (model config, tokenizer) are safe from any thread. Every submitted stream is closed exactly
// once, on the engine thread (or in Submit when it fails nothing is queued and the stream is
// left alone).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/generate/generator.h"
#include "engine/serve/engine_observer.h"
#include "engine/serve/request_stream.h"

namespace specula {

struct EngineOptions {
  // Requests accepted beyond those that can start at the next step; more are RESOURCE_EXHAUSTED.
  int32_t max_waiting = 1024;
  // scheduler.max_overtakes: requests start in arrival order, but when the oldest waiting one
  // does not fit yet, later ones that fit may start ahead of it; a waiting request can be
  // overtaken this many times, then nothing behind it starts until it has (0 = strict FIFO).
  // Small requests are not held behind a large one, and the large one is not starved: once it
  // blocks the queue, running requests finish (or are preempted) until it fits.
  int32_t max_overtakes = 16;
  // The longest a request waits in the queue for its output grammar's token mask preparation
  // (Generator::PrepareMasks; other grammars may be queued ahead of it); then it starts, and its
  // steps build what preparation has not reached.
  absl::Duration max_mask_wait = absl::Seconds(2);
};

struct EngineRequest {
  std::string request_id;  // for logs and metrics
  GenerationRequest generation;
  absl::Time deadline = absl::InfiniteFuture();
};

class Engine {
 public:
  // Starts the engine thread. `observer` may be null; it must outlive the Engine.
  Engine(std::unique_ptr<Generator> generator, EngineOptions options, EngineObserver* observer);
  // Shutdown(CANCELLED) if not done yet.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Only the parts that never change after loading (model config, tokenizer, eos ids, options)
  // may be read from other threads.
  const Generator& generator() const { return *generator_; }

  // Validates the request (INVALID_ARGUMENT naming the field), then queues it: RESOURCE_EXHAUSTED
  // when the waiting queue is full, UNAVAILABLE after StopAccepting. Returns a handle for Cancel.
  absl::StatusOr<uint64_t> Submit(EngineRequest request, std::shared_ptr<RequestStream> stream);
  // Retires the request at the next step boundary and frees its KV; its stream ends with `reason`.
  // Unknown or already finished handles are ignored (the request may have just finished).
  void Cancel(uint64_t handle, absl::Status reason);

  // Sessions (docs/SESSIONS.md), answered by the engine thread between steps: `done` runs there
  // (keep it short: the next step waits for it). No caller's thread waits for the engine, so a
  // flood of these calls holds no worker thread and no place meant for prompts. `done` gets
  // UNAVAILABLE once the engine has stopped, and RESOURCE_EXHAUSTED when kMaxPendingControlOps
  // calls are already waiting, at once on the calling thread.
  // ListSessions: up to `limit` sessions whose ids sort after `after`, in id order.
  using SessionPageDone = std::function<void(absl::StatusOr<PrefixCache::SessionPage>)>;
  void ListSessions(std::string after, int64_t limit, SessionPageDone done);
  // DeleteSession: NOT_FOUND for an unknown id, FAILED_PRECONDITION while a request of the
  // session is queued or running.
  void DeleteSession(std::string id, std::function<void(absl::Status)> done);
  static constexpr size_t kMaxPendingControlOps = 4096;

  // New submissions get UNAVAILABLE from now on; queued and running requests go on.
  void StopAccepting();
  // Blocks until nothing is queued or running, or until `deadline`. True when idle.
  bool WaitIdle(absl::Time deadline);
  // Ends every queued and running request with `reason`, frees their KV and stops the thread.
  void Shutdown(absl::Status reason);

  EngineLoad load() const;
  // Every queued and running request as of the last step (those submitted since, too); any
  // thread, and answered even while a step hangs.
  std::vector<RequestBrief> Requests() const;

  // Tests: while paused, the loop still takes submissions and cancellations but runs no step and
  // admits nothing, so queue states can be set up deterministically.
  void SetPausedForTesting(bool paused);

 private:
  struct Request;  // one submitted request, queued or running (engine thread)

  // What other threads handed over since the loop last looked.
  struct Inbox {
    std::vector<std::unique_ptr<Request>> submitted;
    std::vector<std::pair<uint64_t, absl::Status>> cancels;
    std::vector<std::function<void()>> control;
    bool stop = false;
    bool paused = false;
  };

  void Loop();
  // Sleeps while there is nothing to do (idle: until work or a session expiry; paused with
  // requests: 20 ms at a time, to expire deadlines), then takes the inbox.
  void TakeInbox(Inbox& inbox);
  // Queues the submissions, applies the cancellations and runs the control ops.
  void ApplyInbox(Inbox& inbox);
  // One round: expiry, then admission and a step (neither while paused; after a device fault,
  // the waiting requests fail instead).
  void Advance(bool paused);
  // After the loop: what was handed over meanwhile, then every request ends with the reason.
  void Shutdown();
  void RetireExpired(absl::Time now);
  void Admit();
  // Marks the waiting requests that may start: their output grammar is not being prepared (or
  // they waited EngineOptions::max_mask_wait). Whether any may.
  bool RefreshReady(absl::Time now);
  absl::Status RunStep();
  // Retires a running sequence in the generator (freeing its KV) and keeps its kv_stats.
  void CancelSequence(uint64_t id, Request& r, bool kv_valid = true);
  void Finish(Request& r, absl::Status status, FinishReason finish);
  // Ends every running request with `status`: kCancelled for shutdown, kNone for failures.
  void FailRunning(const absl::Status& status, FinishReason finish);
  // After a failed step: if the device failed, reports it once (EngineObserver::OnDeviceFault).
  void NoteDeviceFault();
  // Ends every waiting request with `status`, like FailRunning.
  void FailWaiting(const absl::Status& status, FinishReason finish);
  void CancelRequest(uint64_t handle, const absl::Status& reason);
  void PublishLoad();
  static void Describe(const Request& r, const char* state, RequestBrief& out);
  // Queues `op` for the engine thread, between steps; UNAVAILABLE once it has stopped (op not
  // queued), RESOURCE_EXHAUSTED past kMaxPendingControlOps. Queued ops run even if the engine
  // stops meanwhile.
  absl::Status PostControl(std::function<void()> op);
  // Runs `work` on the engine thread (PostControl) and hands its result to `done` there; when
  // PostControl refuses, `done` gets the refusal at once on the calling thread.
  template <typename Result>
  void AnswerOnEngineThread(std::function<Result()> work, std::function<void(Result)> done);
  void RunControlOps(std::vector<std::function<void()>>& ops);
  // How long an idle loop may sleep: until the next session expiry.
  absl::Time NextWake() const;

  const std::unique_ptr<Generator> generator_;
  const EngineOptions options_;
  EngineObserver* const observer_;

  // Shared with other threads.
  mutable std::mutex mu_;
  std::condition_variable wake_;   // engine thread: new work or control
  std::condition_variable idle_;   // WaitIdle
  std::vector<std::unique_ptr<Request>> submitted_;
  std::vector<std::pair<uint64_t, absl::Status>> cancels_;
  std::vector<std::function<void()>> control_;  // PostControl's ops
  // Sessions with a request queued or running: a second turn is refused at Submit.
  absl::flat_hash_set<std::string> busy_sessions_;
  uint64_t next_handle_ = 1;
  bool accepting_ = true;
  bool stop_ = false;
  bool paused_ = false;
  bool masks_prepared_ = false;  // a grammar's preparation ended: waiting requests may start
  bool device_failed_ = false;  // engine thread: the device failed; nothing runs any more
  bool thread_done_ = false;  // the loop has ended: control ops are refused
  absl::Status stop_reason_;
  int32_t pending_ = 0;  // submitted + waiting, i.e. not admitted yet
  int32_t running_count_ = 0;
  EngineLoad load_;
  std::vector<RequestBrief> briefs_;  // waiting and running, as of the last PublishLoad

  // Engine thread only.
  std::deque<std::unique_ptr<Request>> waiting_;
  std::map<uint64_t, std::unique_ptr<Request>> running_;  // by generator sequence id
  std::vector<SequenceOutput> outputs_;
  uint64_t steps_ = 0;

  std::thread thread_;
};

}  // namespace specula
