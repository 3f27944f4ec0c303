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

TEST(BackendFactoryTest, CudaIsAClearErrorUntilItExists) {
  BackendOptions options;
  options.device = "cuda";
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(options);
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr("model.device: cuda"));
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
