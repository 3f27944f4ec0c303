#include "engine/backend_factory.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

TEST(BackendFactoryTest, CpuAndAutoGiveTheCpuBackend) {
  for (const char* device : {"cpu", "auto"}) {
    BackendOptions options;
    options.device = device;
    options.threads = 1;
    absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(options);
    ASSERT_TRUE(backend.ok()) << device << ": " << backend.status();
    EXPECT_EQ((*backend)->name(), "cpu");
    // It is a working backend: it allocates.
    EXPECT_TRUE((*backend)->Allocate(64).ok());
  }
}

// Without a CUDA build or a visible GPU, cuda is a clear startup error, never a silent CPU run;
// with both (tools/gpu/check.sh), it is the CUDA backend.
TEST(BackendFactoryTest, CudaIsTheCudaBackendOrAClearError) {
  BackendOptions options;
  options.device = "cuda";
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

TEST(BackendFactoryTest, UnknownDevicesAreInvalid) {
  BackendOptions options;
  options.device = "tpu";
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(options);
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(backend.status().message()),
              HasSubstr("model.device: unknown device 'tpu'"));
}

}  // namespace
}  // namespace specula
