// One sequence's device working set in the sparse KV cache (docs/ARCHITECTURE.md §4): which of its
// host pages sit in which device slot, for every (layer, KV head).
//
// Slot layout, the same for every (layer, KV head), each slot one page of a KV-pool block:
//   [0, S)            sink pages 0..S-1, loaded once when decode starts;
//   [S, S + W + 1)    the recent window, a ring: page p lives in slot S + p % (W + 1). New
//                     tokens are written here; a full page is written back to the host store;
//   [S + W + 1, end)  the cache: `cache_slots` slots holding selected and prefetched pages,
//                     mapped page -> slot per (layer, KV head), replaced least recently used.
// Because the sink and window slots are the same for every head, one KV write per token serves
// all heads, as in the dense pool.
//
// Cache slot states and who may change them (invariant 2 of the issue):
//   free -> loading   a thread claims it for a page (not landed until its copy is enqueued
//                     and done) and enqueues its copy: the engine thread on
//                     the compute stream (a miss, a page leaving the window), a prefetch thread
//                     on its copy stream;
//   loading -> ready  compute-stream copies at once (compute reads the slot only after them, in
//                     stream order); copy-stream copies once their event is seen done;
//   ready -> loading  a claim, only when the slot is not pinned and its copy has landed: a slot
//                     read by the running attention is pinned (pin == active_pin) from its
//                     Resolve until the layer's attention is enqueued; the copy stream then
//                     waits on the compute stream's event recorded after that attention.
// A loading page attended by decode is a late prefetch: the compute stream waits on its event.
// Everything is guarded by `mu`; a thread enqueues copies only to slots it claimed.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/kv/host_kv_store.h"
#include "engine/kv/sparse_options.h"
#include "engine/stream.h"

namespace specula {

struct WorkingSetGeometry {
  int32_t layers = 0;
  int32_t kv_heads = 0;
  int32_t page_size = 0;
  int32_t sink_pages = 0;    // S
  int32_t window_pages = 0;  // W: full pages kept before the current one
  int32_t budget_pages = 0;  // B: selected pages per (layer, KV head) and step
  int32_t cache_slots = 0;   // B + prefetch extra
  int32_t slots_per_head() const { return sink_pages + window_pages + 1 + cache_slots; }
  // With the current page `current`, the first page of the recent window; pages
  // [sink_pages, this) are the candidates for selection.
  int32_t window_begin(int32_t current) const {
    return current - window_pages > sink_pages ? current - window_pages : sink_pages;
  }
};

class WorkingSet {
 public:
  enum class SlotState : uint8_t { kFree, kLoading, kReady };
  struct CacheSlot {
    int32_t page = -1;  // host page index within the sequence (not a PageId)
    SlotState state = SlotState::kFree;
    uint64_t last_use = 0;  // recency stamp: the step that used or was predicted to use it
    uint64_t pin = 0;       // == active_pin while the running attention reads it
    // The event of the copy that filled the slot, until it is seen done.
    std::shared_ptr<Event> fill;
  };

  WorkingSet(const WorkingSetGeometry& geometry, HostKvSequence host,
             std::vector<int32_t> device_blocks, int64_t prompt_tokens);

  const WorkingSetGeometry& geometry() const { return g_; }
  const HostKvSequence& host() const { return host_; }
  HostKvSequence& mutable_host() { return host_; }
  const std::vector<int32_t>& device_blocks() const { return blocks_; }
  int64_t prompt_tokens() const { return prompt_tokens_; }

  int32_t sink_slot(int32_t page) const { return page; }
  int32_t ring_slot(int32_t page) const {
    return g_.sink_pages + page % (g_.window_pages + 1);
  }
  int32_t cache_slot(int32_t j) const { return g_.sink_pages + g_.window_pages + 1 + j; }
  // The slot new tokens of page `page` are written to: its sink slot or its ring slot.
  int32_t write_slot(int32_t page) const {
    return page < g_.sink_pages ? sink_slot(page) : ring_slot(page);
  }

  // --- Under mu ---
  // The cache slot index j holding `page` of head index lh (= layer * kv_heads + head), or -1.
  int32_t FindLocked(int32_t lh, int32_t page) const;
  CacheSlot& slot_locked(int32_t lh, int32_t j) { return heads_[lh].slots[j]; }
  // Claims a cache slot for `page` (not present): a free slot, else the least recently used
  // slot that is not pinned, whose copy has landed and that was last used before
  // `evict_before`. Marks it loading and maps the page to it. -1 when every slot is loading,
  // pinned or too recent.
  int32_t ClaimLocked(int32_t lh, int32_t page, uint64_t evict_before);
  // The claimed slot's copy was enqueued on the compute stream (`fill` marks it): ready, since
  // compute reads the slot after it in stream order.
  void FilledByComputeLocked(int32_t lh, int32_t j, std::shared_ptr<Event> fill);
  // The claimed slot's copy was enqueued on a copy stream: loading until `fill` is done.
  void FilledByCopyStreamLocked(int32_t lh, int32_t j, std::shared_ptr<Event> fill);
  // Whether slot j's copy has completed; a loading slot whose copy has becomes ready.
  bool LandedLocked(int32_t lh, int32_t j);
  // Whether the compute stream may read slot j now without waiting: ready (filled on the
  // compute stream, or its copy seen landed), or its copy has just landed.
  bool ReadableLocked(int32_t lh, int32_t j) {
    return LandedLocked(lh, j) || heads_[lh].slots[j].state == SlotState::kReady;
  }
  // A slot of (lh) whose enqueued copy is still in flight (its `fill` can be waited on), or -1.
  int32_t InFlightLocked(int32_t lh);

  std::mutex mu;
  std::condition_variable cv;  // a prefetch task ended

  // Engine-thread state (no lock: only the engine thread touches these).
  uint64_t decode_step = 0;   // decode steps run so far
  uint64_t active_pin = 1;    // pins equal to this are live; written under mu (claims read it)
  int32_t window_begin = -1;  // first page held by the ring; -1 before decode starts
  KvStats stats;              // pages hit / missed, fetch bytes, stall time

  // Shared with prefetch threads.
  std::atomic<int64_t> bytes_prefetched{0};
  std::atomic<uint64_t> published_step{0};  // decode_step, for prefetch staleness checks
  int32_t active_tasks = 0;  // prefetch tasks working on this sequence; under mu
  // Per layer, the last decode step Resolve ran (under mu): a prediction for that step or an
  // earlier one is too late to help.
  std::vector<uint64_t> resolved_step;
  bool closing = false;      // set by Release; under mu

 private:
  struct HeadState {
    std::vector<int32_t> page_to_slot;  // host page index -> cache slot, -1 = not cached
    std::vector<CacheSlot> slots;
  };
  friend class SparseKvCache;

  WorkingSetGeometry g_;
  HostKvSequence host_;
  std::vector<int32_t> blocks_;  // KV-pool block per slot
  int64_t prompt_tokens_ = 0;
  std::vector<HeadState> heads_;  // [layer * kv_heads + head]
};

}  // namespace specula
