#include "engine/common/buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"

namespace specula {

absl::StatusOr<DeviceBuffer> MapHostMemory(size_t bytes) {
  const size_t mapped = bytes == 0 ? 1 : bytes;
  void* data = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("cannot map %d bytes of host memory: %s", bytes, std::strerror(errno)));
  }
  return DeviceBuffer(data, bytes, [mapped](void* p) { munmap(p, mapped); });
}

}  // namespace specula
