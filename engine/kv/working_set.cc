#include "engine/kv/working_set.h"

#include <algorithm>
#include <cstring>

#include "engine/common/check.h"

namespace specula {
namespace {

// The state buffer's arrays, in order: host_pages and page_slot [lh][pages], then slot_page,
// slot_state and slot_stamp [lh][cache_slots], then blocks [slots_per_head]; all 4-byte words.
struct StateLayout {
  StateLayout(const WorkingSetGeometry& g, int32_t pages) {
    const size_t lh = static_cast<size_t>(g.layers) * g.kv_heads;
    per_page = lh * pages;
    per_slot = lh * g.cache_slots;
    words = 2 * per_page + 3 * per_slot + g.slots_per_head();
  }
  size_t per_page = 0;
  size_t per_slot = 0;
  size_t words = 0;
};

}  // namespace

size_t WorkingSet::DeviceStateBytes(const WorkingSetGeometry& g, int32_t pages_per_head) {
  return StateLayout(g, pages_per_head).words * sizeof(int32_t);
}

WorkingSet::WorkingSet(const WorkingSetGeometry& geometry, HostKvSequence host,
                       std::vector<int32_t> device_blocks, int64_t prompt_tokens,
                       DeviceBuffer state)
    : g_(geometry),
      host_(std::move(host)),
      blocks_(std::move(device_blocks)),
      prompt_tokens_(prompt_tokens),
      state_(std::move(state)) {
  CHECK_EQ(static_cast<int32_t>(blocks_.size()), g_.slots_per_head());
  const StateLayout layout(g_, host_.pages_per_head());
  CHECK_GE(state_.bytes(), layout.words * sizeof(int32_t));
  auto* words = state_.as<int32_t>();
  device_.host_pages = words;
  device_.page_slot = words + layout.per_page;
  device_.slot_page = words + 2 * layout.per_page;
  device_.slot_state = device_.slot_page + layout.per_slot;
  device_.slot_stamp = reinterpret_cast<uint32_t*>(device_.slot_state + layout.per_slot);
  device_.blocks = words + 2 * layout.per_page + 3 * layout.per_slot;
  device_.pages = host_.pages_per_head();
  device_.sink_pages = g_.sink_pages;
  device_.window_pages = g_.window_pages;
  device_.budget_pages = g_.budget_pages;
  device_.cache_slots = g_.cache_slots;
}

void WorkingSet::StageDeviceState(void* staging) {
  const StateLayout layout(g_, host_.pages_per_head());
  auto* words = static_cast<int32_t*>(staging);
  int32_t* at = words;
  for (int32_t layer = 0; layer < g_.layers; ++layer) {
    for (int32_t head = 0; head < g_.kv_heads; ++head) {
      const absl::Span<const PageId> pages = host_.pages(layer, head);
      at = std::copy(pages.begin(), pages.end(), at);
    }
  }
  at = std::fill_n(at, layout.per_page, -1);  // page_slot: nothing cached
  at = std::fill_n(at, layout.per_slot, -1);  // slot_page
  at = std::fill_n(at, layout.per_slot, kSlotFree);
  at = std::fill_n(at, layout.per_slot, 0);  // slot_stamp
  at = std::copy(blocks_.begin(), blocks_.end(), at);
  CHECK_EQ(static_cast<size_t>(at - words), layout.words);
  needs_init_ = false;
  staged_pages_ = host_.allocated_pages_per_head();
}

void WorkingSet::StageGrownPages(
    const std::function<void*(void* device_dst, size_t bytes)>& stage_to) {
  const int32_t from = staged_pages_;
  const int32_t to = host_.allocated_pages_per_head();
  if (needs_init_ || to <= from) return;
  const size_t bytes = static_cast<size_t>(to - from) * sizeof(int32_t);
  // The table is written only here and at init: the device only reads it.
  auto* table = const_cast<int32_t*>(device_.host_pages);
  for (int32_t layer = 0; layer < g_.layers; ++layer) {
    for (int32_t head = 0; head < g_.kv_heads; ++head) {
      const int64_t row = static_cast<int64_t>(layer) * g_.kv_heads + head;
      void* dst = table + row * device_.pages + from;
      const absl::Span<const PageId> pages = host_.pages(layer, head);
      std::memcpy(stage_to(dst, bytes), pages.data() + from, bytes);
    }
  }
  staged_pages_ = to;
}

}  // namespace specula
