#include "engine/kv/page_prefetcher.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_format.h"
#include "engine/common/check.h"
#include "engine/common/stopwatch.h"

namespace specula {

namespace {
constexpr size_t kMaxLatencySamples = 65536;
// Samples' room kept between steps (16 KiB), so a steady step does not grow it.
constexpr size_t kReservedLatencySamples = 2048;
// Gathers whose landing is tracked at once; more in flight go untimed.
constexpr int32_t kTrackedGathers = 1024;
// Compute-stream waits a step can enqueue per layer, a bound: a staging buffer's earlier gather
// per kind (Staging), two AwaitEarlierSteps (the resolve and a cross_layer prediction), and
// AwaitLayer.
constexpr int32_t kWaitsPerLayer = kStagingKinds + 3;
}  // namespace

PagePrefetcher::PagePrefetcher(Backend& backend, int32_t streams, int32_t layers, size_t page_bytes)
    : backend_(backend), layers_(layers), page_bytes_(page_bytes) {
  CHECK_GE(streams, 1);
  for (int32_t i = 0; i < streams; ++i) streams_.push_back(backend.CreateStream());
  for (Kind& k : kinds_) {
    for (Buffer& b : k.buffers) b.gathered.resize(layers);
  }
  latest_.resize(layers);
  earlier_.resize(layers);
  auto pinned = backend.AllocatePinnedHost(kTrackedGathers * sizeof(int32_t));
  CHECK(pinned.ok()) << pinned.status();  // 4 KiB
  gathered_pages_ = std::move(*pinned);
  for (int32_t i = kTrackedGathers - 1; i >= 0; --i) free_slots_.push_back(i);
  // A steady decode step allocates nothing: room for a step's timed waits, and as many timed
  // events made on the compute stream now (its ring reuses them once let go).
  const size_t waits = static_cast<size_t>(kWaitsPerLayer) * layers;
  timed_waits_.reserve(waits);
  std::vector<std::shared_ptr<Event>> made;
  made.reserve(2 * waits);
  for (size_t i = 0; i < 2 * waits; ++i) made.push_back(backend.compute_stream().RecordTimed());
}

PagePrefetcher::~PagePrefetcher() { Drain(); }

absl::Status PagePrefetcher::Prepare(StagingKind which, int32_t lists, int32_t stride) {
  Kind& k = kind(which);
  k.lists = lists;
  k.stride = stride;
  const size_t entries = static_cast<size_t>(lists) * stride;
  if (entries <= k.capacity_entries && static_cast<size_t>(lists) <= k.capacity_lists) {
    return absl::OkStatus();
  }
  const size_t grown_entries = std::max(entries, 2 * k.capacity_entries);
  const size_t grown_lists = std::max<size_t>(lists, 2 * k.capacity_lists);
  for (Buffer& b : k.buffers) {
    // A gather enqueued earlier may still read the old lists: they outlive it.
    std::vector<std::shared_ptr<Event>> readers;
    for (std::shared_ptr<Event>& e : b.gathered) {
      if (e != nullptr) readers.push_back(std::move(e));
    }
    if (!readers.empty()) {
      replaced_.Add(std::make_shared<std::pair<DeviceBuffer, DeviceBuffer>>(std::move(b.copies),
                                                                            std::move(b.counts)),
                    std::move(readers));
    }
    auto copies = backend_.Allocate(grown_entries * layers_ * sizeof(PageGatherEntry));
    auto counts = backend_.Allocate(grown_lists * layers_ * sizeof(int32_t));
    if (!copies.ok() || !counts.ok()) {
      const absl::Status& s = copies.ok() ? counts.status() : copies.status();
      return absl::Status(s.code(), absl::StrFormat("sparse prefetch staging for %d lists: %s",
                                                    lists, s.message()));
    }
    b.copies = std::move(*copies);
    b.counts = std::move(*counts);
    std::fill(b.gathered.begin(), b.gathered.end(), nullptr);
  }
  k.capacity_entries = grown_entries;
  k.capacity_lists = grown_lists;
  return absl::OkStatus();
}

PageStaging PagePrefetcher::Staging(StagingKind which, int32_t layer) {
  Kind& k = kind(which);
  Buffer& b = k.buffers[parity_];
  // Normally landed long ago.
  WaitOnCompute(b.gathered[layer]);
  Poll();
  PageStaging s;
  s.copy_stride = k.stride;
  s.copies = DeviceSpan<PageGatherEntry>(
      b.copies.as<PageGatherEntry>() + static_cast<size_t>(layer) * k.capacity_entries,
      static_cast<size_t>(k.lists) * k.stride);
  s.copy_count = DeviceSpan<int32_t>(
      b.counts.as<int32_t>() + static_cast<size_t>(layer) * k.capacity_lists, k.lists);
  return s;
}

void PagePrefetcher::Launch(StagingKind which, int32_t layer) {
  Kind& k = kind(which);
  Buffer& b = k.buffers[parity_];
  Stream& stream = *streams_[layer % streams_.size()];
  // After the selection that wrote the lists, and so after every attention enqueued before it
  // that could read a slot the selection gave away.
  stream.Wait(backend_.compute_stream().Record());
  PageGatherArgs args;
  args.copies = DeviceSpan<const PageGatherEntry>(
      b.copies.as<PageGatherEntry>() + static_cast<size_t>(layer) * k.capacity_entries,
      static_cast<size_t>(k.lists) * k.stride);
  args.copy_count = DeviceSpan<const int32_t>(
      b.counts.as<int32_t>() + static_cast<size_t>(layer) * k.capacity_lists, k.lists);
  args.lists = k.lists;
  args.copy_stride = k.stride;
  args.page_bytes = page_bytes_;
  int32_t slot = -1;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
    args.pages_gathered = gathered_pages_.as<int32_t>() + slot;
  }
  backend_.GatherPages(stream, args);
  b.gathered[layer] = stream.Record();
  latest_[layer] = b.gathered[layer];
  if (slot >= 0) pending_.push_back({b.gathered[layer], slot, MonotonicSeconds()});
}

void PagePrefetcher::AwaitEarlierSteps(int32_t layer) {
  WaitOnCompute(earlier_[layer]);
  earlier_[layer] = nullptr;
}

void PagePrefetcher::AwaitLayer(int32_t layer) {
  WaitOnCompute(latest_[layer]);
  earlier_[layer] = nullptr;
}

void PagePrefetcher::WaitOnCompute(const std::shared_ptr<Event>& event) {
  if (event == nullptr || event->Done()) return;
  // Timed on the compute stream's own clock: on a CPU the engine thread blocks in Wait, on a GPU
  // the stream stands still while the host goes on.
  Stream& compute = backend_.compute_stream();
  std::shared_ptr<Event> before = compute.RecordTimed();
  compute.Wait(event);
  timed_waits_.push_back({std::move(before), compute.RecordTimed()});
}

void PagePrefetcher::EndStep() {
  Poll();
  parity_ ^= 1;
  earlier_ = latest_;
}

void PagePrefetcher::Drain() {
  for (auto& s : streams_) s->Synchronize();
  Poll();
}

void PagePrefetcher::RecordFences(std::vector<std::shared_ptr<Event>>* fences) {
  fences->clear();
  for (auto& s : streams_) fences->push_back(s->Record());
}

absl::Status PagePrefetcher::TakeCopyError() {
  absl::Status first;
  for (auto& s : streams_) first.Update(s->TakeError());
  return first;
}

void PagePrefetcher::Poll() {
  const double now = MonotonicSeconds();
  auto landed = [&](const Pending& p) {
    if (!p.event->Done()) return false;
    const int32_t pages = gathered_pages_.as<int32_t>()[p.slot];
    for (int32_t i = 0; i < pages && latencies_.size() < kMaxLatencySamples; ++i) {
      latencies_.push_back(now - p.launched);
    }
    free_slots_.push_back(p.slot);
    return true;
  };
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), landed), pending_.end());
  replaced_.Reap(/*wait=*/false);
}

double PagePrefetcher::TakeStallSeconds() {
  double seconds = 0;
  // Called after the step's synchronization, so its waits are read; one the stream has not
  // passed (none, in the engine) is kept for the next call.
  auto read = [&](const TimedWait& w) {
    const std::optional<double> s = w.after->SecondsSince(*w.before);
    if (s.has_value()) seconds += *s;
    return s.has_value();
  };
  timed_waits_.erase(std::remove_if(timed_waits_.begin(), timed_waits_.end(), read),
                     timed_waits_.end());
  return seconds;
}

void PagePrefetcher::TakeLatencies(std::vector<double>* out) {
  out->swap(latencies_);
  latencies_.clear();
  // The two buffers trade places each step: both get a step's usual samples' room once.
  latencies_.reserve(kReservedLatencySamples);
}

}  // namespace specula
