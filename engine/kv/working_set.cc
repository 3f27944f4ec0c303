#include "engine/kv/working_set.h"

#include "engine/common/check.h"

namespace specula {

WorkingSet::WorkingSet(const WorkingSetGeometry& geometry, HostKvSequence host,
                       std::vector<int32_t> device_blocks, int64_t prompt_tokens)
    : g_(geometry), host_(std::move(host)), blocks_(std::move(device_blocks)),
      prompt_tokens_(prompt_tokens) {
  CHECK_EQ(static_cast<int32_t>(blocks_.size()), g_.slots_per_head());
  heads_.resize(static_cast<size_t>(g_.layers) * g_.kv_heads);
  resolved_step.assign(g_.layers, 0);
  for (HeadState& h : heads_) {
    h.page_to_slot.assign(host_.pages_per_head(), -1);
    h.slots.resize(g_.cache_slots);
  }
}

int32_t WorkingSet::FindLocked(int32_t lh, int32_t page) const {
  return heads_[lh].page_to_slot[page];
}

int32_t WorkingSet::ClaimLocked(int32_t lh, int32_t page, uint64_t evict_before) {
  HeadState& h = heads_[lh];
  CHECK_EQ(h.page_to_slot[page], -1);
  int32_t victim = -1;
  for (int32_t j = 0; j < static_cast<int32_t>(h.slots.size()); ++j) {
    const CacheSlot& s = h.slots[j];
    if (s.state == SlotState::kFree) {
      victim = j;
      break;
    }
    if (s.pin == active_pin || s.last_use >= evict_before || !LandedLocked(lh, j)) continue;
    if (victim < 0 || s.last_use < h.slots[victim].last_use) victim = j;
  }
  if (victim < 0) return -1;
  CacheSlot& s = h.slots[victim];
  if (s.page >= 0) h.page_to_slot[s.page] = -1;
  s.page = page;
  s.state = SlotState::kLoading;
  s.pin = 0;
  s.fill = nullptr;
  h.page_to_slot[page] = victim;
  return victim;
}

void WorkingSet::FilledByComputeLocked(int32_t lh, int32_t j, std::shared_ptr<Event> fill) {
  CacheSlot& s = heads_[lh].slots[j];
  CHECK(s.state == SlotState::kLoading && s.fill == nullptr);
  s.state = SlotState::kReady;
  s.fill = std::move(fill);
}

void WorkingSet::FilledByCopyStreamLocked(int32_t lh, int32_t j, std::shared_ptr<Event> fill) {
  CacheSlot& s = heads_[lh].slots[j];
  CHECK(s.state == SlotState::kLoading && s.fill == nullptr && fill != nullptr);
  s.fill = std::move(fill);
}

bool WorkingSet::LandedLocked(int32_t lh, int32_t j) {
  CacheSlot& s = heads_[lh].slots[j];
  if (s.state == SlotState::kLoading && s.fill == nullptr) return false;  // not enqueued yet
  if (s.fill != nullptr && !s.fill->Done()) return false;
  s.fill = nullptr;
  if (s.state == SlotState::kLoading) s.state = SlotState::kReady;
  return true;
}

int32_t WorkingSet::InFlightLocked(int32_t lh) {
  for (int32_t j = 0; j < static_cast<int32_t>(heads_[lh].slots.size()); ++j) {
    if (heads_[lh].slots[j].fill != nullptr && !LandedLocked(lh, j)) return j;
  }
  return -1;
}

}  // namespace specula
