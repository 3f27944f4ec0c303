// Prepares a step's token masks on a thread of its own while the step's forward pass runs
// (issue 38: "compute it while that step's forward pass runs, ready before its logits are"). A
// step's masks depend only on the tokens its rows accepted before it, all known once the step is
// planned, so the step waits for max(forward pass, masks) instead of their sum. On CUDA the
// forward pass is the device's and the engine thread only enqueues it; on the CPU backend it runs
// on the engine thread, beside this one.
//
// Between Start and Wait the constraints, their grammars' mask caches and the masker belong to
// the worker's thread; the engine thread touches none of them (it runs the forward pass).
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/generate/output_constraint.h"
#include "engine/grammar/token_mask.h"

namespace specula {

class MaskWorker {
 public:
  // `masker` (with its pool of walk threads) is shared with the engine thread's own uses of it,
  // which never fall between Start and Wait. The thread starts with the first Start.
  explicit MaskWorker(grammar::TokenMasker& masker) : masker_(masker) {}
  ~MaskWorker();
  MaskWorker(const MaskWorker&) = delete;
  MaskWorker& operator=(const MaskWorker&) = delete;

  // Starts preparing each constraint's next mask (OutputConstraint::PrepareMask). At most one
  // batch at a time: Wait before the next Start.
  void Start(const std::vector<OutputConstraint*>& constraints);
  // Returns once every mask of the last Start is prepared (at once without one).
  void Wait();

 private:
  void Loop();

  grammar::TokenMasker& masker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<OutputConstraint*> batch_;  // written by Start, read by the thread while pending_
  bool pending_ = false;                  // a batch is started and not yet prepared
  bool stop_ = false;
  std::thread thread_;  // last: started by the first Start
};

}  // namespace specula
