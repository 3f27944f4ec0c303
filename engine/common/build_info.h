// What this binary is: the project version (CMake's project(VERSION), semver), the git revision
// it was built from, the build type and the CUDA toolkit it was compiled with ("none" without the
// CUDA backend). Printed by every binary's --version, reported by GetModelInfo, /v1/models and the
// specula_build_info metric.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace specula {

struct BuildInfo {
  absl::string_view version;     // "0.1.0"
  absl::string_view revision;    // "5cee4f6a1b2c", "5cee4f6a1b2c-dirty" or "unknown"
  absl::string_view build_type;  // "RelWithDebInfo", "Debug", ...
  absl::string_view cuda;        // "13.0.88" or "none"
};

const BuildInfo& GetBuildInfo();

// "specula-server 0.1.0 (git 5cee4f6a1b2c, RelWithDebInfo, CUDA 13.0.88)".
std::string VersionLine(absl::string_view program);

}  // namespace specula
