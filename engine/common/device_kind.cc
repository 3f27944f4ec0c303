#include "engine/common/device_kind.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace specula {
namespace {

constexpr std::pair<DeviceKind, absl::string_view> kDeviceNames[] = {
    {DeviceKind::kCpu, "cpu"}, {DeviceKind::kCuda, "cuda"}, {DeviceKind::kAuto, "auto"}};

}  // namespace

absl::string_view DeviceKindName(DeviceKind device) {
  for (const auto& [kind, name] : kDeviceNames) {
    if (kind == device) return name;
  }
  return "unknown";
}

absl::StatusOr<DeviceKind> ParseDeviceKind(absl::string_view name) {
  for (const auto& [kind, known] : kDeviceNames) {
    if (known == name) return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("must be one of cpu, cuda, auto, got '", name, "'"));
}

}  // namespace specula
