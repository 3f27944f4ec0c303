// The version line of every binary: the project version from CMake, a git revision, the build
// type, the CUDA toolkit.
#include "engine/common/build_info.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

using ::testing::MatchesRegex;

TEST(BuildInfoTest, SaysTheProjectVersionAndWhereTheBuildCameFrom) {
  const BuildInfo& b = GetBuildInfo();
  EXPECT_EQ(b.version, SPECULA_EXPECTED_VERSION);  // CMake's project(VERSION), given by the build
  EXPECT_THAT(std::string(b.revision), MatchesRegex("([0-9a-f]{12}(-dirty)?)|unknown"));
  EXPECT_EQ(b.build_type, SPECULA_EXPECTED_BUILD_TYPE);
  EXPECT_FALSE(b.cuda.empty());
  EXPECT_EQ(VersionLine("specula-server"),
            "specula-server " + std::string(b.version) + " (git " + std::string(b.revision) +
                ", " + std::string(b.build_type) + ", CUDA " + std::string(b.cuda) + ")");
}

}  // namespace
}  // namespace specula
