#include "server/watchdog.h"

#include <algorithm>

#include "engine/common/log.h"

namespace specula {

Watchdog::Watchdog(const Engine& engine, absl::Duration stall_after,
                   std::function<void(bool)> on_change)
    : engine_(engine),
      stall_after_(stall_after),
      on_change_(std::move(on_change)),
      last_steps_(engine.load().steps),
      last_progress_(absl::Now()),
      // Four checks per period: a stall is noticed within 1.25 periods.
      thread_(std::max(stall_after / 4, absl::Milliseconds(10)), [this] {
        std::lock_guard lock(mu_);
        CheckLocked(absl::Now());
      }) {}

bool Watchdog::stalled() const {
  std::lock_guard lock(mu_);
  return stalled_;
}

uint64_t Watchdog::checks() const {
  std::lock_guard lock(mu_);
  return checks_;
}

void Watchdog::CheckLocked(absl::Time now) {
  ++checks_;
  const EngineLoad load = engine_.load();
  if (load.steps != last_steps_ || load.waiting + load.running == 0) {
    last_steps_ = load.steps;
    last_progress_ = now;
    if (stalled_) {
      stalled_ = false;
      Log(LogLevel::kWarning, "engine_recovered", {{"steps", load.steps}});
      on_change_(false);
    }
    return;
  }
  if (stalled_ || now - last_progress_ < stall_after_) return;
  stalled_ = true;
  LogStall(load, now - last_progress_);
  on_change_(true);
}

void Watchdog::LogStall(const EngineLoad& load, absl::Duration stuck_for) const {
  Log(LogLevel::kError, "engine_stalled",
      {{"seconds_without_progress", absl::ToDoubleSeconds(stuck_for)},
       {"running", load.running},
       {"waiting", load.waiting},
       {"steps", load.steps}});
  const absl::Time now = absl::Now();
  for (const RequestBrief& r : engine_.Requests()) {
    Log(LogLevel::kError, "stalled_request",
        {{"request_id", r.request_id},
         {"state", r.state},
         {"prompt_tokens", r.prompt_tokens},
         {"completion_tokens", r.completion_tokens},
         {"age_seconds", absl::ToDoubleSeconds(now - r.submitted)}});
  }
}

}  // namespace specula
