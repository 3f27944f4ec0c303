// A span of backend memory: what backend operations read their metadata from (token ids,
// positions, block tables, page lists) and write their small outputs to. A distinct type from
// absl::Span so that host memory cannot be handed to a device operation by accident: on a GPU
// that would be an illegal address, found only at run time there. It has no element access on
// purpose; a backend turns it into something it may read (the CPU backend checks, in
// CpuBackend::Host, that it really lies in backend memory).
#pragma once

#include <cstddef>
#include <type_traits>

namespace specula {

template <typename T>
class DeviceSpan {
 public:
  DeviceSpan() = default;
  DeviceSpan(T* data, size_t size) : data_(data), size_(size) {}
  // A const view of a mutable span.
  template <typename U, typename = std::enable_if_t<std::is_same_v<const U, T>>>
  DeviceSpan(const DeviceSpan<U>& other) : data_(other.data()), size_(other.size()) {}

  T* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t bytes() const { return size_ * sizeof(T); }
  // Elements [offset, offset + n).
  DeviceSpan subspan(size_t offset, size_t n) const { return DeviceSpan(data_ + offset, n); }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace specula
