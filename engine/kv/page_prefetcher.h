// The prefetch executor (docs/SPARSE_KV.md, "Prefetch"): dedicated copy streams that load the
// pages the device's selection staged, while the compute stream goes on with the next layers.
//
// Per step and layer, a selection operation (resolve: misses and cross_step's ranked pages; or
// stage: cross_layer and the prompt's last row) writes lists of page copies into a staging
// buffer; Launch then makes a copy stream wait for the compute stream's event after that
// operation and gather the lists (one batched gather per layer and kind), each page marked ready
// on the device once it has landed. Under miss_policy fetch attention never waits for these
// copies: a page whose copy has not landed is late and read from the host store. Under defer
// the decode waits for them at two points per layer (AwaitEarlierSteps before selecting,
// AwaitLayer before attending), so what it attends never depends on when a copy lands.
//
// Staging buffers are double-buffered by step parity, so under fetch a layer's copies may take up
// to two steps to land before the compute stream has to wait for them (Staging); under defer,
// one (AwaitEarlierSteps). Those waits are the decode stall this executor can cause, and are
// measured.
//
// Engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/backend.h"
#include "engine/kv/keep_until_done.h"

namespace specula {

// Who stages: the decode resolve (misses, cross_step), the decode's cross_layer predictions, and
// the end of a sparse prefill (the first decode step's pages). Each has its own buffers, since
// each may stage for the same layer in one step.
enum class StagingKind : int32_t { kResolve = 0, kPredict = 1, kPrefill = 2 };
inline constexpr int kStagingKinds = 3;

class PagePrefetcher {
 public:
  // `streams` copy streams; layer l's gathers go to stream l % streams.
  PagePrefetcher(Backend& backend, int32_t streams, int32_t layers, size_t page_bytes);
  ~PagePrefetcher();  // drains every stream
  PagePrefetcher(const PagePrefetcher&) = delete;
  PagePrefetcher& operator=(const PagePrefetcher&) = delete;

  // Sizes this step's staging of `kind`: `lists` (rows * KV heads) lists of at most `stride`
  // copies. Grows its buffers when needed; a replaced buffer is freed once the gathers that read
  // it are done (never waited for).
  absl::Status Prepare(StagingKind kind, int32_t lists, int32_t stride);
  // Where selection `kind` of `layer` stages its copies this step. The compute stream first
  // waits for the gather that last read this buffer (two steps ago) to be done.
  PageStaging Staging(StagingKind kind, int32_t layer);
  // After the selection that filled Staging(kind, layer): a copy stream gathers its lists.
  void Launch(StagingKind kind, int32_t layer);
  // The compute stream waits until every gather of `layer` launched in an earlier step has
  // landed (once per layer and step; later calls return at once). Then no slot of the layer is
  // loading but those staged in this step, so the slots a selection may claim, and the pages it
  // finds resident, are the same however fast the copies ran.
  void AwaitEarlierSteps(int32_t layer);
  // The compute stream waits until every gather of `layer` launched so far (this step's
  // cross_layer staging included) has landed: before attention reads late pages' slots.
  void AwaitLayer(int32_t layer);
  // Ends the step (the next one uses the other buffers of every kind).
  void EndStep();
  // Waits until every copy enqueued so far has landed (tests, destruction, regrowing buffers).
  void Drain();
  // Events marking everything enqueued so far on every copy stream (a sequence's release: its
  // slots and state are reused only once they are done). Never blocks.
  void RecordFences(std::vector<std::shared_ptr<Event>>* fences);
  // The first failed gather on any copy stream since the last call (landed or not, its slots
  // may never turn ready); cleared by the call.
  absl::Status TakeCopyError();

  // The time the compute stream stood still waiting for copies, since the last call (each wait
  // timed by two of the stream's timed events: engine-thread time on a CPU, device time on a
  // GPU; read once the stream has passed them, after the step's synchronization), and the
  // enqueue-to-landed time of each page of the gathers seen done (one sample per page moved;
  // from the host's enqueue, so an upper bound at the resolution of a layer).
  double TakeStallSeconds();
  void TakeLatencies(std::vector<double>* out);

 private:
  struct Buffer {
    DeviceBuffer copies;                           // [layers][capacity_entries] entries
    DeviceBuffer counts;                           // [layers][capacity_lists]
    std::vector<std::shared_ptr<Event>> gathered;  // per layer: the last gather from it
  };
  struct Kind {
    Buffer buffers[2];  // by step parity
    int32_t lists = 0;
    int32_t stride = 0;
    size_t capacity_entries = 0;  // per layer
    size_t capacity_lists = 0;
  };
  struct Pending {
    std::shared_ptr<Event> event;
    int32_t slot = 0;  // of gathered_pages_, where the gather reports the pages it moved
    double launched = 0;
  };

  Kind& kind(StagingKind k) { return kinds_[static_cast<int>(k)]; }
  void Poll();
  // Makes the compute stream wait for `event` (null or done: nothing to wait for), timed.
  void WaitOnCompute(const std::shared_ptr<Event>& event);
  struct TimedWait {
    std::shared_ptr<Event> before, after;  // the compute stream's timed events around a wait
  };

  Backend& backend_;
  int32_t layers_;
  size_t page_bytes_;
  std::vector<std::unique_ptr<Stream>> streams_;
  Kind kinds_[kStagingKinds];
  int32_t parity_ = 0;
  DeviceBuffer gathered_pages_;      // pinned host: one count per tracked gather
  std::vector<int32_t> free_slots_;  // of gathered_pages_
  std::vector<Pending> pending_;
  KeepUntilDone replaced_;  // staging buffers gathers may still read
  // Per layer: its last gather (any kind), and its last one launched before this step until
  // AwaitEarlierSteps has waited for it (a layer's gathers share one stream, in order).
  std::vector<std::shared_ptr<Event>> latest_;
  std::vector<std::shared_ptr<Event>> earlier_;
  std::vector<double> latencies_;
  std::vector<TimedWait> timed_waits_;  // not yet read (TakeStallSeconds)
};

}  // namespace specula
