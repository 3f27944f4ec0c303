// The CPU backend's record of the memory it handed out, so it can check what a GPU would fault
// on: a DeviceSpan that does not point into backend memory (a host vector passed to a device
// operation), or into pinned host memory where device memory is expected. On the CPU all of it is
// ordinary host memory, so without this check such a mistake would pass every CPU test and crash
// only on a GPU.
//
// Thread-safe: buffers are allocated and freed from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace specula {

enum class MemoryKind { kDevice, kPinnedHost };

class MemoryRegistry {
 public:
  void Add(const void* data, size_t bytes, MemoryKind kind);
  void Remove(const void* data);
  // Whether [data, data + bytes) lies inside one allocation of `kind`. Empty ranges pass.
  bool Contains(const void* data, size_t bytes, MemoryKind kind) const;

 private:
  struct Range {
    uintptr_t end;
    MemoryKind kind;
  };
  mutable std::mutex mu_;
  std::map<uintptr_t, Range> ranges_;  // by start address
};

}  // namespace specula
