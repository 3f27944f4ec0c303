#include "engine/cpu/memory_registry.h"

namespace specula {

void MemoryRegistry::Add(const void* data, size_t bytes, MemoryKind kind) {
  const auto begin = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(mu_);
  ranges_[begin] = Range{begin + bytes, kind};
}

void MemoryRegistry::Remove(const void* data) {
  std::lock_guard<std::mutex> lock(mu_);
  ranges_.erase(reinterpret_cast<uintptr_t>(data));
}

bool MemoryRegistry::Contains(const void* data, size_t bytes, MemoryKind kind) const {
  if (bytes == 0) return true;
  const auto begin = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ranges_.upper_bound(begin);
  if (it == ranges_.begin()) return false;
  --it;
  return it->second.kind == kind && begin + bytes <= it->second.end;
}

}  // namespace specula
