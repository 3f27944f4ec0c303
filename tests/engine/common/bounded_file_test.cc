#include "engine/common/bounded_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/specula_bounded_" + std::to_string(getpid()) + "_" + name;
}

std::string Write(const std::string& name, const std::string& bytes) {
  const std::string path = TempPath(name);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return path;
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(ReadBoundedFile, ReadsARegularFileWholeUpToTheLimit) {
  const std::string bytes = std::string(1000, 'a') + std::string("\0b\n", 3);
  const std::string path = Write("exact", bytes);
  absl::StatusOr<std::string> text = ReadBoundedFile(path, 1003, "what");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, bytes);
  EXPECT_EQ(*ReadBoundedFile(Write("empty", ""), 10, "what"), "");
  std::remove(path.c_str());
}

TEST(ReadBoundedFile, OneByteOverTheLimitIsRefusedNamingTheRoleAndPath) {
  const std::string path = Write("over", std::string(1004, 'a'));
  absl::StatusOr<std::string> text = ReadBoundedFile(path, 1003, "server.auth.token_file");
  ASSERT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(text.status()), HasSubstr("server.auth.token_file '" + path + "' is 1004 bytes"));
  EXPECT_THAT(Message(text.status()), HasSubstr("more than the limit of 1003"));
  std::remove(path.c_str());
}

TEST(ReadBoundedFile, DevicesAreRefusedWithoutReading) {
  for (const char* path : {"/dev/zero", "/dev/urandom", "/dev/null"}) {
    absl::StatusOr<std::string> text = ReadBoundedFile(path, 1 << 20, "model.chat_template");
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << path;
    EXPECT_THAT(Message(text.status()), HasSubstr("is not a regular file")) << path;
  }
  // Through a symlink too: the check is on what was opened, not on the name.
  const std::string link = TempPath("link");
  std::remove(link.c_str());
  ASSERT_EQ(symlink("/dev/zero", link.c_str()), 0);
  EXPECT_THAT(Message(ReadBoundedFile(link, 1 << 20, "x").status()),
              HasSubstr("is not a regular file"));
  std::remove(link.c_str());
}

TEST(ReadBoundedFile, AFifoIsRefusedWithoutWaitingForAWriter) {
  const std::string fifo = TempPath("fifo");
  std::remove(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Without O_NONBLOCK the open itself would block this test forever.
  absl::StatusOr<std::string> text = ReadBoundedFile(fifo, 1 << 20, "x");
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(text.status()), HasSubstr("is not a regular file"));
  std::remove(fifo.c_str());
}

TEST(ReadBoundedFile, MissingDirectoryAndForbiddenHaveTheirOwnCodes) {
  EXPECT_EQ(ReadBoundedFile(TempPath("missing"), 10, "x").status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<std::string> dir = ReadBoundedFile(::testing::TempDir(), 10, "x");
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(dir.status()), HasSubstr("is a directory"));
  if (geteuid() != 0) {  // root reads anything
    const std::string path = Write("secret", "s");
    ASSERT_EQ(chmod(path.c_str(), 0), 0);
    EXPECT_EQ(ReadBoundedFile(path, 10, "x").status().code(),
              absl::StatusCode::kPermissionDenied);
    std::remove(path.c_str());
  }
}

// A file whose size stat reports wrongly (procfs says 0) is read to its real end, and the limit
// still holds on the bytes actually read.
TEST(ReadBoundedFile, TheLimitHoldsOnTheBytesReadNotOnTheReportedSize) {
  absl::StatusOr<std::string> status = ReadBoundedFile("/proc/self/status", 1 << 20, "x");
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_THAT(*status, HasSubstr("VmRSS"));
  ASSERT_GT(status->size(), 100u);
  absl::StatusOr<std::string> capped = ReadBoundedFile("/proc/self/status", 100, "x");
  EXPECT_EQ(capped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(capped.status()), HasSubstr("grew past the limit of 100 bytes"));
}

}  // namespace
}  // namespace specula
