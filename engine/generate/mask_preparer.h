// Prepares a grammar's token mask cache before its first request runs (issue 38): the walks of
// the vocabulary that cost the most (a JSON string's, 50-90 ms at a 128K vocabulary, once per
// string shape and process) are built on a thread of this class's own, not inside a batch step
// that every running request waits for. The engine admits a request once its grammar is
// prepared (Generator::MasksReady); other requests start and decode meanwhile, and the request
// itself waits for its preparation in the queue (its time to first token pays it, once per
// schema, instead of the whole batch's time between tokens).
//
// Each preparation is bounded (`budget`), and so is the queue (kMaxQueued; past it a grammar is
// not claimed and its requests start at once); what preparation does not reach is built by the
// steps that meet it, as without preparation. The engine also bounds how long a request waits.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "engine/generate/output_constraint.h"
#include "engine/grammar/shared_mask_entries.h"
#include "engine/grammar/token_mask.h"

namespace specula {

class MaskPreparer {
 public:
  // `table`, `shared` and `caches` outlive this. `threads`: the walks' pool (TokenMasker).
  MaskPreparer(const grammar::TokenTable& table, grammar::SharedMaskEntries* shared,
               MaskCaches& caches, int threads, std::chrono::milliseconds budget);
  ~MaskPreparer();
  MaskPreparer(const MaskPreparer&) = delete;
  MaskPreparer& operator=(const MaskPreparer&) = delete;

  // Runs on the preparer's thread after each grammar is prepared (the engine wakes to admit its
  // requests). Once SetOnPrepared returns, the one it replaced no longer runs (so its owner may
  // go: set an empty one first).
  void SetOnPrepared(std::function<void()> on_prepared);
  // Any thread: queues `g` unless it has a cache, is queued already, or kMaxQueued grammars
  // wait. `awaited`: a request waits for it (the grammar that holds from its first token); those
  // are prepared before the others (a strict tool call's, needed once the model opens a call).
  // The thread starts with the first grammar.
  void Request(const std::shared_ptr<const grammar::Grammar>& g, bool awaited);
  static constexpr size_t kMaxQueued = 64;

 private:
  void Loop();
  void PrepareOne(const std::shared_ptr<const grammar::Grammar>& g);

  MaskCaches& caches_;
  grammar::TokenMasker masker_;  // this thread's
  const std::chrono::milliseconds budget_;
  // Its own lock: on_prepared_ takes the engine's, whose holder (Submit) takes mu_.
  std::mutex on_prepared_mu_;
  std::function<void()> on_prepared_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<const grammar::Grammar>> awaited_, later_;
  bool stop_ = false;
  std::atomic<bool> cancel_{false};  // the preparation under way stops between keys
  std::thread thread_;  // last: started by the first Request
};

}  // namespace specula
