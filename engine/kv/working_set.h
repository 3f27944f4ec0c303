// One sparse sequence in the sparse KV cache (docs/SPARSE_KV.md): its host pages, the KV-pool
// blocks that hold its device slots, and its residency state, which lives in backend memory
// because the device operations (engine/backend/sparse_ops.h) keep it: which page sits in which
// cache slot, each slot's state and recency.
//
// Slot layout, the same for every (layer, KV head), each slot one page of a KV-pool block:
//   [0, S)            sink pages 0..S-1, loaded when decode starts;
//   [S, S + W + 1)    the recent window, a ring: page p lives in slot S + p % (W + 1). New tokens
//                     are written here; a full page is written back to the host store;
//   [S + W + 1, end)  the cache: `cache_slots` slots holding selected and staged pages.
// Because the sink and window slots are the same for every head, one KV write per token serves
// all heads, as in the dense pool.
//
// Engine thread only: copy streams touch the device state, never this object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/kv/host_kv_store.h"
#include "engine/kv/sparse_options.h"

namespace specula {

struct WorkingSetGeometry {
  int32_t layers = 0;
  int32_t kv_heads = 0;
  int32_t page_size = 0;
  int32_t sink_pages = 0;    // S
  int32_t window_pages = 0;  // W: full pages kept before the current one
  int32_t budget_pages = 0;  // B: selected pages per (layer, KV head) and step
  int32_t cache_slots = 0;   // C = B + prefetch extra
  int32_t slots_per_head() const { return sink_pages + window_pages + 1 + cache_slots; }
  // With the current page `current`, the first page of the recent window; pages
  // [sink_pages, this) are the candidates for selection.
  int32_t window_begin(int32_t current) const {
    return current - window_pages > sink_pages ? current - window_pages : sink_pages;
  }
  // The longest attend list: sinks, the budget and the window with the current page.
  int32_t list_capacity() const { return sink_pages + budget_pages + window_pages + 1; }
};

class WorkingSet {
 public:
  // Bytes of device state for `g` with `pages_per_head` host pages per (layer, KV head).
  static size_t DeviceStateBytes(const WorkingSetGeometry& g, int32_t pages_per_head);

  // `state` holds DeviceStateBytes(...) of backend memory; it is initialized by the first plan
  // that stages it (StageDeviceState).
  WorkingSet(const WorkingSetGeometry& geometry, HostKvSequence host,
             std::vector<int32_t> device_blocks, int64_t prompt_tokens, DeviceBuffer state);

  const WorkingSetGeometry& geometry() const { return g_; }
  const HostKvSequence& host() const { return host_; }
  HostKvSequence& mutable_host() { return host_; }
  const std::vector<int32_t>& device_blocks() const { return blocks_; }
  int64_t prompt_tokens() const { return prompt_tokens_; }

  int32_t sink_slot(int32_t page) const { return page; }
  int32_t ring_slot(int32_t page) const { return g_.sink_pages + page % (g_.window_pages + 1); }
  int32_t cache_slot(int32_t j) const { return g_.sink_pages + g_.window_pages + 1 + j; }
  // The slot new tokens of page `page` are written to: its sink slot or its ring slot.
  int32_t write_slot(int32_t page) const {
    return page < g_.sink_pages ? sink_slot(page) : ring_slot(page);
  }

  // The device state's pointers, for the plan's rows.
  const SparseSeqDevice& device() const { return device_; }
  // Whether the device state still needs its initial values (host page table, empty slots).
  bool needs_init() const { return needs_init_; }
  // Writes the initial device state into `staging` (DeviceStateBytes bytes, uploaded to the
  // state buffer by the plan) and marks it initialized.
  void StageDeviceState(void* staging);
  // Host pages allocated (HostKvStore::Grow) since the device's page table was last staged:
  // for each (layer, KV head), `stage_to(device address, bytes)` returns where to write that
  // row's new entries (StepPlan::StageTo); one call per row, for the pages grown since.
  void StageGrownPages(const std::function<void*(void* device_dst, size_t bytes)>& stage_to);
  void* device_state() const { return state_.data(); }
  size_t device_state_bytes() const { return state_.bytes(); }

  // Engine-thread bookkeeping.
  uint32_t decode_step = 0;   // decode steps run so far
  int32_t window_begin = -1;  // first page held by the ring; -1 before decode starts
  KvStats stats;              // pages hit / missed / late, bytes, stall time

 private:
  WorkingSetGeometry g_;
  HostKvSequence host_;
  std::vector<int32_t> blocks_;  // KV-pool block per slot
  int64_t prompt_tokens_ = 0;
  DeviceBuffer state_;
  SparseSeqDevice device_;
  bool needs_init_ = true;
  int32_t staged_pages_ = 0;  // pages per head whose host page the device's table holds
};

}  // namespace specula
