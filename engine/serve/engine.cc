#include "engine/serve/engine.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_format.h"
#include "engine/common/check.h"
#include "engine/common/log.h"
#include "engine/common/session_busy.h"

namespace specula {

struct Engine::Request {
  uint64_t handle = 0;
  EngineRequest request;
  std::shared_ptr<RequestStream> stream;
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // set once admitted
  absl::Time submitted;
  double queue_seconds = -1;  // set once admitted
  int32_t overtaken = 0;      // later requests admitted ahead of it (EngineOptions::max_overtakes)
  // Its output grammar is prepared (or it waited long enough): it may start. Once true, stays.
  bool ready = false;
  // Output so far.
  int64_t completion_tokens = 0;
  double ttft_seconds = -1;
  absl::Time last_token;
  // From the sequence's last output (finished or cancelled in the generator).
  std::optional<KvStats> kv_stats;
};

namespace {

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

bool HadSparseActivity(const SparseStepStats& s) {
  return s.pages_hit > 0 || s.pages_missed > 0 || s.pages_late > 0 || s.bytes_prefetched > 0 ||
         s.bytes_fetched > 0 || s.stall_seconds > 0 || !s.prefetch_latencies_seconds.empty();
}

}  // namespace

Engine::Engine(std::unique_ptr<Generator> generator, EngineOptions options,
               EngineObserver* observer)
    : generator_(std::move(generator)), options_(options), observer_(observer) {
  CHECK(generator_ != nullptr);
  load_.kv_blocks_total = generator_->kv_pool().num_blocks();
  load_.kv_page_size = generator_->kv_pool().page_size();
  load_.host_pages_capacity = generator_->host_pages_capacity();
  // The observer sees the capacities before the first request, not zero until then (the engine
  // thread does not exist yet, so reading the generator here is safe).
  PublishLoad();
  generator_->SetOnMasksPrepared([this] {
    std::lock_guard lock(mu_);
    masks_prepared_ = true;
    wake_.notify_one();
  });
  thread_ = std::thread([this] { Loop(); });
}

Engine::~Engine() {
  Shutdown(absl::CancelledError("the engine is shutting down"));
  generator_->SetOnMasksPrepared(nullptr);  // the preparer outlives this object's lock
}

absl::StatusOr<uint64_t> Engine::Submit(EngineRequest request,
                                        std::shared_ptr<RequestStream> stream) {
  CHECK(stream != nullptr);
  // Validation reads only what never changes after loading, so it runs on the caller's thread.
  if (absl::Status s = generator_->Validate(request.generation); !s.ok()) return s;
  auto r = std::make_unique<Request>();
  r->prompt_tokens = static_cast<int64_t>(request.generation.prompt.size());
  r->request = std::move(request);
  r->stream = std::move(stream);
  r->submitted = absl::Now();
  std::lock_guard lock(mu_);
  if (!accepting_ || stop_) {
    return absl::UnavailableError("the server is shutting down and takes no new requests");
  }
  const int64_t free_slots = std::max(0, generator_->options().max_running - running_count_);
  if (pending_ >= int64_t{options_.max_waiting} + free_slots) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the request queue is full: %d requests wait (scheduler.max_waiting_requests = %d) and "
        "%d run; retry later",
        pending_, options_.max_waiting, running_count_));
  }
  const std::string& session = r->request.generation.session_id;
  if (!session.empty() && !busy_sessions_.insert(session).second) {
    return SessionBusyError(absl::StrFormat(
        "session '%s' has a request queued or running; send its next turn after that one "
        "finishes",
        session));
  }
  // Before the engine can see it: a grammar new to the engine is claimed for preparing now, and
  // the request waits for it (Admit).
  generator_->PrepareMasks(r->request.generation);
  r->handle = next_handle_++;
  const uint64_t handle = r->handle;
  submitted_.push_back(std::move(r));
  ++pending_;
  wake_.notify_one();
  return handle;
}

void Engine::Cancel(uint64_t handle, absl::Status reason) {
  std::lock_guard lock(mu_);
  cancels_.emplace_back(handle, std::move(reason));
  wake_.notify_one();
}

absl::Status Engine::PostControl(std::function<void()> op) {
  std::lock_guard lock(mu_);
  if (thread_done_) return absl::UnavailableError("the engine has stopped");
  if (control_.size() >= kMaxPendingControlOps) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%d session calls are already waiting for the engine; retry later", kMaxPendingControlOps));
  }
  control_.push_back(std::move(op));
  wake_.notify_one();
  return absl::OkStatus();
}

void Engine::RunControlOps(std::vector<std::function<void()>>& ops) {
  for (auto& op : ops) op();
  ops.clear();
}

template <typename Result>
void Engine::AnswerOnEngineThread(std::function<Result()> work, std::function<void(Result)> done) {
  // Shared: if PostControl refuses, the op holding it is gone and `done` gets the refusal here.
  auto shared_done = std::make_shared<std::function<void(Result)>>(std::move(done));
  absl::Status posted =
      PostControl([work = std::move(work), shared_done] { (*shared_done)(work()); });
  if (!posted.ok()) (*shared_done)(std::move(posted));
}

void Engine::ListSessions(std::string after, int64_t limit, SessionPageDone done) {
  AnswerOnEngineThread<absl::StatusOr<PrefixCache::SessionPage>>(
      [this, after = std::move(after), limit] { return generator_->ListSessions(after, limit); },
      std::move(done));
}

void Engine::DeleteSession(std::string id, std::function<void(absl::Status)> done) {
  {
    std::lock_guard lock(mu_);
    if (busy_sessions_.contains(id)) {
      return done(SessionBusyError(absl::StrFormat(
          "session '%s' has a request queued or running; delete it after that request ends", id)));
    }
  }
  // Load is published before `done` runs, so gauges already show the freed KV.
  AnswerOnEngineThread<absl::Status>(
      [this, id = std::move(id)] {
        absl::Status status = generator_->DeleteSession(id);
        PublishLoad();
        return status;
      },
      std::move(done));
}

absl::Time Engine::NextWake() const { return generator_->NextSessionExpiry(); }

void Engine::StopAccepting() {
  std::lock_guard lock(mu_);
  accepting_ = false;
}

bool Engine::WaitIdle(absl::Time deadline) {
  std::unique_lock lock(mu_);
  const auto until = absl::ToChronoTime(deadline);
  return idle_.wait_until(lock, until, [&] { return pending_ == 0 && running_count_ == 0; });
}

void Engine::Shutdown(absl::Status reason) {
  {
    std::lock_guard lock(mu_);
    if (!stop_) {
      stop_ = true;
      accepting_ = false;
      stop_reason_ = std::move(reason);
    }
    wake_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

EngineLoad Engine::load() const {
  std::lock_guard lock(mu_);
  return load_;
}

void Engine::SetPausedForTesting(bool paused) {
  std::lock_guard lock(mu_);
  paused_ = paused;
  wake_.notify_one();
}

void Engine::Loop() {
  Inbox inbox;
  while (true) {
    TakeInbox(inbox);
    ApplyInbox(inbox);
    if (inbox.stop) break;
    Advance(inbox.paused);
    PublishLoad();
  }
  Shutdown();
}

void Engine::TakeInbox(Inbox& inbox) {
  const absl::Time session_expiry = NextWake();
  std::unique_lock lock(mu_);
  auto has_control = [&] {
    return stop_ || !submitted_.empty() || !cancels_.empty() || !control_.empty() ||
           masks_prepared_;
  };
  const bool has_requests = !running_.empty() || !waiting_.empty();
  // A request whose grammar is being prepared cannot start: with only those, the loop waits.
  const bool can_step = !running_.empty() || RefreshReady(absl::Now());
  if (paused_ || !can_step) {
    if (has_requests) {
      // Paused with requests, or waiting for preparations: wake now and then to expire
      // deadlines.
      wake_.wait_for(lock, std::chrono::milliseconds(20), has_control);
    } else if (session_expiry == absl::InfiniteFuture()) {
      // Idle: sleep until there is work or a session expires.
      wake_.wait(lock, has_control);
    } else {
      wake_.wait_until(lock, absl::ToChronoTime(session_expiry), has_control);
    }
  }
  masks_prepared_ = false;
  inbox.submitted.swap(submitted_);
  inbox.cancels.swap(cancels_);
  inbox.control.swap(control_);
  inbox.stop = stop_;
  inbox.paused = paused_;
}

void Engine::ApplyInbox(Inbox& inbox) {
  for (auto& r : inbox.submitted) waiting_.push_back(std::move(r));
  inbox.submitted.clear();
  for (auto& [handle, reason] : inbox.cancels) CancelRequest(handle, reason);
  inbox.cancels.clear();
  RunControlOps(inbox.control);
}

void Engine::Advance(bool paused) {
  const absl::Time now = absl::Now();
  generator_->ExpireSessions(now);
  RetireExpired(now);
  if (device_failed_) {
    FailWaiting(generator_->device_fault(), FinishReason::kNone);
    return;
  }
  if (paused) return;
  Admit();
  if (!generator_->HasWork()) return;
  // Published before the step too: should it hang, the requests in it stay visible in load()
  // and Requests(), which is what the watchdog reads.
  PublishLoad();
  if (absl::Status s = RunStep(); !s.ok()) {
    FailRunning(s, FinishReason::kNone);
    NoteDeviceFault();
  }
}

void Engine::Shutdown() {
  absl::Status reason;
  std::vector<std::function<void()>> control;
  {
    std::lock_guard lock(mu_);
    reason = stop_reason_;
    for (auto& r : submitted_) waiting_.push_back(std::move(r));
    submitted_.clear();
    control.swap(control_);
    thread_done_ = true;
  }
  RunControlOps(control);
  FailWaiting(reason, FinishReason::kCancelled);
  FailRunning(reason, FinishReason::kCancelled);
  PublishLoad();
}

void Engine::CancelRequest(uint64_t handle, const absl::Status& reason) {
  auto w = std::find_if(waiting_.begin(), waiting_.end(),
                        [&](const auto& r) { return r->handle == handle; });
  if (w != waiting_.end()) {
    Finish(**w, reason, FinishReason::kCancelled);
    waiting_.erase(w);
    return;
  }
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if (it->second->handle != handle) continue;
    CancelSequence(it->first, *it->second);
    Finish(*it->second, reason, FinishReason::kCancelled);
    running_.erase(it);
    return;
  }
}

void Engine::RetireExpired(absl::Time now) {
  auto expired = [&](const Request& r) { return r.request.deadline <= now; };
  auto deadline_status = [](const Request& r) {
    return absl::DeadlineExceededError(
        absl::StrFormat("deadline exceeded after %d generated tokens", r.completion_tokens));
  };
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (!expired(**it)) {
      ++it;
      continue;
    }
    Finish(**it, deadline_status(**it), FinishReason::kCancelled);
    it = waiting_.erase(it);
  }
  for (auto it = running_.begin(); it != running_.end();) {
    if (!expired(*it->second)) {
      ++it;
      continue;
    }
    CancelSequence(it->first, *it->second);
    Finish(*it->second, deadline_status(*it->second), FinishReason::kCancelled);
    it = running_.erase(it);
  }
}

bool Engine::RefreshReady(absl::Time now) {
  bool any = false;
  for (const auto& r : waiting_) {
    r->ready = r->ready || generator_->MasksReady(r->request.generation) ||
               now - r->submitted >= options_.max_mask_wait;
    any |= r->ready;
  }
  return any;
}

void Engine::Admit() {
  const size_t max_running = static_cast<size_t>(generator_->options().max_running);
  RefreshReady(absl::Now());  // once: a request found not ready below is not ready in this pass
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    // No slot: nothing in the queue can start.
    if (generator_->num_running() >= max_running) return;
    Request& r = **it;
    if (!r.ready) {  // its grammar is being prepared: later requests start meanwhile
      ++it;
      continue;
    }
    // Checked first so a long prompt that does not fit is not copied every step.
    const bool fits = generator_->HasRoomFor(r.request.generation);
    // A copy: should Add still refuse, the request stays queued, in order.
    absl::StatusOr<uint64_t> id =
        fits ? generator_->Add(r.request.generation) : absl::ResourceExhaustedError("no room");
    if (absl::IsResourceExhausted(id.status())) {
      // Later requests may pass it, until it has been passed max_overtakes times.
      if (r.overtaken >= options_.max_overtakes) return;
      ++it;
      continue;
    }
    if (!id.ok()) {
      Finish(r, id.status(), FinishReason::kNone);
      it = waiting_.erase(it);
      continue;
    }
    bool limit_reached = false;  // an earlier request may not be passed again
    for (auto before = waiting_.begin(); before != it; ++before) {
      // One waiting for its preparation was not passed for want of room.
      if ((*before)->ready) limit_reached |= ++(*before)->overtaken >= options_.max_overtakes;
    }
    r.queue_seconds = Seconds(absl::Now() - r.submitted);
    r.cached_prompt_tokens = generator_->CachedPromptTokens(*id);
    if (observer_) {
      observer_->OnAdmitted(Admission{r.request.request_id, r.prompt_tokens, r.cached_prompt_tokens,
                                      r.queue_seconds});
    }
    running_.emplace(*id, std::move(*it));
    it = waiting_.erase(it);
    if (limit_reached) return;
  }
}

absl::Status Engine::RunStep() {
  outputs_.clear();
  const absl::Time start = absl::Now();
  absl::Status status = generator_->Step(&outputs_);
  ++steps_;
  const absl::Time now = absl::Now();
  if (!status.ok()) return status;
  if (observer_) {
    StepSummary step;
    step.decode_rows = generator_->last_step().decode_rows;
    step.prefill_tokens = generator_->last_step().prefill_tokens;
    step.seconds = Seconds(now - start);
    step.device_wait_seconds = generator_->last_step().device_wait_seconds;
    step.prefill_rows = generator_->last_step().prefill_rows;
    observer_->OnStep(step);
    if (HadSparseActivity(generator_->last_step().sparse)) {
      observer_->OnSparseStep(generator_->last_step().sparse);
    }
  }
  for (const SequenceOutput& out : outputs_) {
    auto it = running_.find(out.id);
    CHECK(it != running_.end());
    Request& r = *it->second;
    if (!out.error.ok()) {  // failed alone; the generator retired it and discarded its KV
      if (out.kv_stats.has_value()) r.kv_stats = out.kv_stats;
      Finish(r, out.error, FinishReason::kNone);
      running_.erase(it);
      continue;
    }
    for (size_t i = 0; i < out.tokens.size(); ++i) {
      if (r.completion_tokens++ == 0) {
        r.ttft_seconds = Seconds(now - r.submitted);
        if (observer_) observer_->OnFirstToken(r.ttft_seconds);
      } else if (observer_) {
        observer_->OnNextToken(Seconds(now - r.last_token));
      }
      r.last_token = now;
    }
    r.stream->Append(out);
    if (out.kv_stats.has_value()) r.kv_stats = out.kv_stats;
    if (out.finish != FinishReason::kNone) {
      // The generator has retired it and freed its KV already.
      Finish(r, absl::OkStatus(), out.finish);
      running_.erase(it);
    }
  }
  return absl::OkStatus();
}

void Engine::FailRunning(const absl::Status& status, FinishReason finish) {
  for (auto& [id, r] : running_) {
    // A failed step may have written part of the KV: it is not kept for reuse.
    CancelSequence(id, *r, /*kv_valid=*/finish != FinishReason::kNone);
    Finish(*r, status, finish);
  }
  running_.clear();
}

void Engine::NoteDeviceFault() {
  if (device_failed_ || generator_->device_fault().ok()) return;
  device_failed_ = true;
  LogAsync(LogLevel::kError, "device_fault", {{"error", generator_->device_fault().message()}});
  if (observer_) observer_->OnDeviceFault(generator_->device_fault());
}

void Engine::FailWaiting(const absl::Status& status, FinishReason finish) {
  while (!waiting_.empty()) {
    Finish(*waiting_.front(), status, finish);
    waiting_.pop_front();
  }
}

void Engine::CancelSequence(uint64_t id, Request& r, bool kv_valid) {
  SequenceOutput last;
  CHECK(generator_->Cancel(id, &last, kv_valid).ok());
  if (last.kv_stats.has_value()) r.kv_stats = last.kv_stats;
}

void Engine::Finish(Request& r, absl::Status status, FinishReason finish) {
  if (observer_) {
    RequestSummary s;
    s.request_id = r.request.request_id;
    s.prompt_tokens = r.prompt_tokens;
    s.completion_tokens = r.completion_tokens;
    s.cached_prompt_tokens = r.cached_prompt_tokens;
    s.finish = finish;
    s.code = status.code();
    s.error = std::string(status.message());
    const absl::Time now = absl::Now();
    s.queue_seconds = r.queue_seconds >= 0 ? r.queue_seconds : Seconds(now - r.submitted);
    s.ttft_seconds = r.ttft_seconds;
    s.e2e_seconds = Seconds(now - r.submitted);
    s.kv_stats = r.kv_stats;
    observer_->OnFinished(s);
  }
  if (const std::string& session = r.request.generation.session_id; !session.empty()) {
    std::lock_guard lock(mu_);
    busy_sessions_.erase(session);
  }
  r.stream->Close(std::move(status), finish,
                  TokenUsage{r.prompt_tokens, r.completion_tokens, r.cached_prompt_tokens},
                  r.kv_stats);
}

void Engine::Describe(const Request& r, const char* state, RequestBrief& out) {
  out.request_id.assign(r.request.request_id);
  out.state = state;
  out.prompt_tokens = r.prompt_tokens;
  out.completion_tokens = r.completion_tokens;
  out.submitted = r.submitted;
}

std::vector<RequestBrief> Engine::Requests() const {
  std::lock_guard lock(mu_);
  std::vector<RequestBrief> out = briefs_;
  for (const auto& r : submitted_) Describe(*r, "submitted", out.emplace_back());
  return out;
}

void Engine::PublishLoad() {
  std::lock_guard lock(mu_);
  pending_ = static_cast<int32_t>(submitted_.size() + waiting_.size());
  running_count_ = static_cast<int32_t>(running_.size());
  load_.waiting = pending_;
  load_.running = running_count_;
  load_.kv_blocks_used = generator_->kv_blocks_used();
  load_.host_pages_used = generator_->host_pages_used();
  load_.device_slots_used = generator_->device_slots_used();
  load_.kv_blocks_cached = generator_->kv_blocks_cached();
  load_.host_pages_cached = generator_->host_pages_cached();
  const PrefixCacheCounters& cache = generator_->prefix_cache_counters();
  load_.sessions = cache.sessions;
  load_.session_kv_bytes = cache.session_bytes;
  load_.evicted_pages = cache.evicted_pages;
  load_.preemptions = generator_->preemptions();
  load_.steps = steps_;
  // Element-wise, so the strings keep their capacity from step to step.
  briefs_.resize(waiting_.size() + running_.size());
  size_t i = 0;
  for (const auto& r : waiting_) Describe(*r, "waiting", briefs_[i++]);
  for (const auto& [id, r] : running_) Describe(*r, "running", briefs_[i++]);
  // Under the lock, so that whoever WaitIdle() releases already sees the observer's view (e.g.
  // the running gauge at 0). Observers are cheap and never call back into the engine.
  if (observer_) observer_->OnLoad(load_);
  if (pending_ == 0 && running_count_ == 0) idle_.notify_all();
}

}  // namespace specula
