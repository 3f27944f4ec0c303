// Memory owned by a backend or mapped for it, freed by its own deleter.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"

namespace specula {

// Memory owned by a backend (host memory on the CPU backend, device memory on CUDA).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(void* data, size_t bytes, std::function<void(void*)> deleter)
      : data_(data, std::move(deleter)), bytes_(bytes) {}

  void* data() const { return data_.get(); }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_.get());
  }

 private:
  std::unique_ptr<void, std::function<void(void*)>> data_{nullptr, [](void*) {}};
  size_t bytes_ = 0;
};

// `bytes` of anonymous, page-aligned host memory, committed lazily (resident memory grows with
// use) and registrable with a device (cudaHostRegister). RESOURCE_EXHAUSTED when it cannot be
// mapped. The CPU backend's pinned host memory.
absl::StatusOr<DeviceBuffer> MapHostMemory(size_t bytes);

}  // namespace specula
