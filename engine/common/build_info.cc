#include "engine/common/build_info.h"

#include "absl/strings/str_cat.h"
#include "engine/common/build_info_config.h"  // generated at configure time
#include "engine/common/git_revision.h"       // generated at build time

namespace specula {

const BuildInfo& GetBuildInfo() {
  static const BuildInfo info{SPECULA_VERSION, SPECULA_GIT_REVISION, SPECULA_BUILD_TYPE,
                              SPECULA_CUDA_VERSION};
  return info;
}

std::string VersionLine(absl::string_view program) {
  const BuildInfo& b = GetBuildInfo();
  return absl::StrCat(program, " ", b.version, " (git ", b.revision, ", ", b.build_type,
                      ", CUDA ", b.cuda, ")");
}

}  // namespace specula
