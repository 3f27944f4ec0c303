// server.stall_seconds: notices an engine that has work but makes no progress (a hung device, a
// deadlock, a step that never ends). After `stall_after` with requests queued or running and no
// forward pass, it reports the stall once (health turns NOT_SERVING, so an orchestrator stops
// routing here and may restart the server) and logs every request's state; when steps run again
// it reports the recovery. An idle engine is never stalled.
//
// Its own thread checks a few times per `stall_after`; the engine is only read (load() and
// Requests(), both answered while a step hangs).
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>

#include "absl/time/time.h"
#include "engine/serve/engine.h"
#include "server/periodic_thread.h"

namespace specula {

class Watchdog {
 public:
  // `on_change(stalled)` runs on the watchdog's thread when the engine stalls and when it
  // recovers. The engine must outlive the Watchdog.
  Watchdog(const Engine& engine, absl::Duration stall_after, std::function<void(bool)> on_change);

  bool stalled() const;
  // Checks made so far (tests wait on it rather than on time).
  uint64_t checks() const;

 private:
  // One check at `now`; the caller holds mu_.
  void CheckLocked(absl::Time now);
  void LogStall(const EngineLoad& load, absl::Duration stuck_for) const;

  const Engine& engine_;
  const absl::Duration stall_after_;
  const std::function<void(bool)> on_change_;
  mutable std::mutex mu_;
  bool stalled_ = false;        // guarded by mu_
  uint64_t checks_ = 0;         // guarded by mu_
  uint64_t last_steps_ = 0;     // guarded by mu_
  absl::Time last_progress_;    // guarded by mu_: a step ran, or the engine had no work
  PeriodicThread thread_;       // last: started after the rest, stopped before it goes
};

}  // namespace specula
