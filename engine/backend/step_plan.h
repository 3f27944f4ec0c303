// A step's metadata, planned on the host and uploaded once (FlashInfer's plan/run split): the
// host writes everything the step's operations read (token ids, positions, block tables, the
// sparse rows' plans) into one pinned staging buffer; Upload() copies it to backend memory in one
// asynchronous copy on the compute stream; every layer's operations then read it there. Nothing
// crosses the bus per layer, and the step's operations could be captured as a graph.
//
// Use, once per step: Clear(); Add/Reserve slices and fill them through Host(); Scratch for
// outputs one operation writes and a later one reads; StageTo for other backend memory that
// should receive bytes with this upload; Upload(); then Device(slice). Slices are offsets, so
// they stay valid while the staging buffer grows.
//
// Engine thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/backend/backend.h"
#include "engine/common/check.h"

namespace specula {

template <typename T>
struct PlanSlice {
  size_t offset = 0;  // bytes into the staged (or scratch) region
  size_t count = 0;
  bool scratch = false;
};

class StepPlan {
 public:
  explicit StepPlan(Backend& backend) : backend_(backend) {}

  // Starts a new plan. Waits for the previous upload's copy to have read the staging buffer
  // (normally long done: a step synchronizes at its readback).
  void Clear();

  template <typename T>
  PlanSlice<T> Reserve(size_t count) {
    PlanSlice<T> s{Take(&staged_bytes_, count * sizeof(T)), count, false};
    EnsureStaging(staged_bytes_);
    return s;
  }
  template <typename T>
  PlanSlice<T> Add(absl::Span<const T> values) {
    PlanSlice<T> s = Reserve<T>(values.size());
    if (!values.empty()) std::memcpy(Host(s), values.data(), values.size() * sizeof(T));
    return s;
  }
  // The staged values, writable until Upload.
  template <typename T>
  T* Host(PlanSlice<T> s) {
    CHECK(!s.scratch) << "scratch has no host copy";
    return reinterpret_cast<T*>(staging_.as<char>() + s.offset);
  }
  // Backend memory for the step, not uploaded, zeroed by Upload.
  template <typename T>
  PlanSlice<T> Scratch(size_t count) {
    return PlanSlice<T>{Take(&scratch_bytes_, count * sizeof(T)), count, true};
  }
  // `bytes` of staging that Upload copies to `device_dst` (backend memory the caller owns);
  // fill them through the returned pointer before Upload.
  void* StageTo(void* device_dst, size_t bytes);

  // Copies the staged bytes to backend memory (one copy, plus one per StageTo) and zeroes the
  // scratch, all on the compute stream. RESOURCE_EXHAUSTED if a buffer cannot grow.
  absl::Status Upload();

  template <typename T>
  DeviceSpan<T> Device(PlanSlice<T> s) const {
    CHECK(uploaded_) << "StepPlan::Device before Upload";
    char* base = s.scratch ? scratch_.as<char>() : device_.as<char>();
    return DeviceSpan<T>(reinterpret_cast<T*>(base + s.offset), s.count);
  }

  size_t staged_bytes() const { return staged_bytes_; }
  // Counts reallocations of the backend buffers Device() points into.
  uint64_t generation() const { return generation_; }

 private:
  static constexpr size_t kAlign = 64;
  static size_t Take(size_t* used, size_t bytes);
  void EnsureStaging(size_t bytes);

  struct Extra {
    void* device_dst;
    size_t offset;
    size_t bytes;
  };

  Backend& backend_;
  DeviceBuffer staging_;  // pinned host
  DeviceBuffer device_;   // backend memory receiving the staged bytes
  DeviceBuffer scratch_;  // backend memory, zeroed per step
  size_t staged_bytes_ = 0;
  size_t scratch_bytes_ = 0;
  std::vector<Extra> extras_;
  std::shared_ptr<Event> upload_done_;
  bool uploaded_ = false;
  uint64_t generation_ = 0;
};

}  // namespace specula
