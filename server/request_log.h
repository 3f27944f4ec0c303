// One info-level log line per request that reached the engine (rejections are logged where they
// happen, in the call), with the numbers an operator greps for. Written asynchronously
// (LogAsync): these run on the engine thread.
#pragma once

#include "engine/serve/engine_observer.h"

namespace specula {

class RequestLog : public EngineObserver {
 public:
  void OnAdmitted(const Admission& admission) override;
  void OnFinished(const RequestSummary& summary) override;
};

}  // namespace specula
