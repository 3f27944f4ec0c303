#include "engine/backend/step_plan.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace specula {
namespace {
constexpr size_t kMinDeviceBytes = size_t{256} << 10;
}  // namespace

void StepPlan::Clear() {
  if (upload_done_ != nullptr) {
    // The copy engine has read the staging buffer: normally long done (the step synchronized at
    // its readback), and then no host synchronization is spent on it.
    if (!upload_done_->Done()) upload_done_->Synchronize();
    upload_done_ = nullptr;
  }
  staged_bytes_ = 0;
  scratch_bytes_ = 0;
  extras_.clear();
  uploaded_ = false;
}

size_t StepPlan::Take(size_t* used, size_t bytes) {
  const size_t offset = (*used + kAlign - 1) / kAlign * kAlign;
  *used = offset + bytes;
  return offset;
}

void StepPlan::EnsureStaging(size_t bytes) {
  if (bytes <= staging_.bytes()) return;
  const size_t grown = std::max(bytes, 2 * staging_.bytes() + (size_t{64} << 10));
  absl::StatusOr<DeviceBuffer> next = backend_.AllocatePinnedHost(grown);
  // A plan is bounded by the configuration (rows per step, prompt chunk, running requests):
  // failing to stage a few MiB of pinned memory leaves the engine nothing sensible to do.
  CHECK(next.ok()) << "step plan: " << next.status();
  if (staging_.bytes() > 0) std::memcpy(next->data(), staging_.data(), staging_.bytes());
  staging_ = std::move(*next);
}

void* StepPlan::StageTo(void* device_dst, size_t bytes) {
  const size_t offset = Take(&staged_bytes_, bytes);
  EnsureStaging(staged_bytes_);
  extras_.push_back({device_dst, offset, bytes});
  return staging_.as<char>() + offset;
}

absl::Status StepPlan::Upload() {
  CHECK(!uploaded_) << "StepPlan::Upload twice";
  auto grow = [&](DeviceBuffer* buffer, size_t bytes, const char* what) -> absl::Status {
    if (bytes <= buffer->bytes()) return absl::OkStatus();
    // At least 256 KiB: contexts grow a page at a time, and the metadata with them.
    absl::StatusOr<DeviceBuffer> next =
        backend_.Allocate(std::max({bytes, 2 * buffer->bytes(), kMinDeviceBytes}));
    if (!next.ok()) {
      return absl::Status(next.status().code(),
                          absl::StrFormat("step plan %s: %s", what, next.status().message()));
    }
    *buffer = std::move(*next);
    ++generation_;
    return absl::OkStatus();
  };
  if (absl::Status s = grow(&device_, staged_bytes_, "metadata"); !s.ok()) return s;
  if (absl::Status s = grow(&scratch_, scratch_bytes_, "scratch"); !s.ok()) return s;
  if (staged_bytes_ > 0) backend_.CopyToDeviceAsync(device_.data(), staging_.data(), staged_bytes_);
  for (const Extra& e : extras_) {
    backend_.CopyToDeviceAsync(e.device_dst, staging_.as<char>() + e.offset, e.bytes);
  }
  if (scratch_bytes_ > 0) backend_.Memset(scratch_.data(), 0, scratch_bytes_);
  upload_done_ = backend_.compute_stream().Record();
  uploaded_ = true;
  return absl::OkStatus();
}

}  // namespace specula
