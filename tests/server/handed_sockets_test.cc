#include "server/handed_sockets.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace specula {
namespace {

struct SocketPair {
  int ends[2] = {-1, -1};
  SocketPair() { EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, ends), 0); }
  ~SocketPair() {
    for (int fd : ends) {
      if (fd >= 0) close(fd);
    }
  }
  int Release(int i) {
    const int fd = ends[i];
    ends[i] = -1;
    return fd;
  }
};

TEST(HandedSocketsTest, CountsTheSocketsStillOpen) {
  HandedSockets handed;
  SocketPair a, b, c;
  handed.Add(a.ends[0]);
  handed.Add(b.ends[0]);
  handed.Add(c.ends[0]);
  EXPECT_EQ(handed.CountOpen(), 3);
  close(b.Release(0));
  EXPECT_EQ(handed.recorded(), 3);  // gRPC closes without telling: noticed only by a count
  EXPECT_EQ(handed.CountOpen(), 2);
  EXPECT_EQ(handed.recorded(), 2);
}

// The descriptor number of a closed socket is the next one handed out: the count must not mistake
// the new socket, or a file, for the old one.
TEST(HandedSocketsTest, ADescriptorNumberReusedForAnotherSocketOrAFileIsNotTheOldSocket) {
  HandedSockets handed;
  SocketPair a, b;
  const int fd_a = a.Release(0);
  const int fd_b = b.Release(0);
  handed.Add(fd_a);
  handed.Add(fd_b);
  close(fd_a);
  SocketPair reused;  // takes the lowest free number: fd_a's
  ASSERT_EQ(reused.ends[0], fd_a);
  EXPECT_EQ(handed.CountOpen(), 1) << "the socket on fd_a is not the one handed over";
  handed.Add(reused.ends[0]);
  EXPECT_EQ(handed.CountOpen(), 2);

  close(fd_b);
  const int file = open("/dev/null", O_RDONLY);
  ASSERT_EQ(file, fd_b);
  EXPECT_EQ(handed.CountOpen(), 1);
  close(file);
}

TEST(HandedSocketsTest, WhatIsNotAnOpenSocketIsNotRecorded) {
  HandedSockets handed;
  const int file = open("/dev/null", O_RDONLY);
  ASSERT_GE(file, 0);
  handed.Add(file);
  handed.Add(-1);
  EXPECT_EQ(handed.recorded(), 0);
  close(file);
}

}  // namespace
}  // namespace specula
