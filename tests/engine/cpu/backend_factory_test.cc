#include "engine/backend/backend_factory.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/common/log.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

TEST(BackendFactoryTest, CpuGivesTheCpuBackend) {
  BackendOptions options;
  options.device = DeviceKind::kCpu;
  options.threads = 1;
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(options);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->name(), "cpu");
  // It is a working backend: it allocates.
  EXPECT_TRUE((*backend)->Allocate(64).ok());
}

// auto is CUDA exactly when the build has it and a GPU is visible (on the GPU machine), the CPU
// otherwise, and the log line says which and why.
TEST(BackendFactoryTest, AutoPicksTheGpuWhenOneIsUsableAndSaysWhy) {
  std::vector<std::string> lines;
  SetLogSinkForTesting([&](absl::string_view line) { lines.emplace_back(line); });
  BackendOptions options;
  options.device = DeviceKind::kAuto;
  options.threads = 1;
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(options);
  SetLogSinkForTesting(nullptr);
  ASSERT_TRUE(backend.ok()) << backend.status();
  const absl::Status gpu = CudaUsableForAuto();
  EXPECT_EQ((*backend)->name(), gpu.ok() ? "cuda" : "cpu");
  if (!CudaBackendBuilt()) {
    EXPECT_THAT(std::string(gpu.message()), HasSubstr("no CUDA backend"));
  }
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("event=backend_selected"));
  EXPECT_THAT(lines[0], HasSubstr(absl::StrCat("device=", (*backend)->name())));
  EXPECT_THAT(lines[0], HasSubstr("requested=auto"));
  if (!gpu.ok()) {
    EXPECT_THAT(lines[0], HasSubstr(std::string(gpu.message())));
  }
}

// Without a CUDA build or a visible GPU, cuda is a clear startup error, never a silent CPU run;
// with both (tools/gpu/check.sh), it is the CUDA backend.
TEST(BackendFactoryTest, CudaIsTheCudaBackendOrAClearError) {
  BackendOptions options;
  options.device = DeviceKind::kCuda;
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(options);
  if (backend.ok()) {
    EXPECT_TRUE(CudaBackendBuilt());
    EXPECT_EQ((*backend)->name(), "cuda");
    EXPECT_EQ((*backend)->default_kv_dtype(), DType::kBF16);
    return;
  }
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr("model.device: cuda"));
  EXPECT_THAT(std::string(backend.status().message()),
              HasSubstr(CudaBackendBuilt() ? "no usable CUDA device" : "no CUDA backend"));
}

TEST(BackendFactoryTest, DeviceNamesRoundTripAndOthersAreInvalid) {
  for (DeviceKind kind : {DeviceKind::kCpu, DeviceKind::kCuda, DeviceKind::kAuto}) {
    absl::StatusOr<DeviceKind> parsed = ParseDeviceKind(DeviceKindName(kind));
    ASSERT_TRUE(parsed.ok()) << DeviceKindName(kind);
    EXPECT_EQ(*parsed, kind);
  }
  EXPECT_EQ(DeviceKindName(DeviceKind::kCuda), "cuda");
  for (absl::string_view bad : {"tpu", "CPU", "", "gpu"}) {
    absl::StatusOr<DeviceKind> parsed = ParseDeviceKind(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(parsed.status().message()),
                HasSubstr(absl::StrCat("must be one of cpu, cuda, auto, got '", bad, "'")));
  }
}

}  // namespace
}  // namespace specula
