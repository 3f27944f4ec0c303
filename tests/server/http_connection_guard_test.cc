// The slowloris guard on its own, with a clock the test moves and socket pairs standing for
// connections: a socket it shuts down reads as ended on the other side.
#include "server/http_connection_guard.h"

#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <mutex>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

using ::testing::ElementsAre;

// One connection: the server's end is handed to the guard, the client's end tells whether the
// server's was shut down.
class Pair {
 public:
  Pair() { EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds_.data()), 0); }
  ~Pair() {
    close(fds_[0]);
    close(fds_[1]);
  }
  int server() const { return fds_[0]; }
  // Whether the server's end was shut down: the client reads the end of the stream at once
  // (an open one has nothing to read: EAGAIN).
  bool Shut() const {
    char c;
    return recv(fds_[1], &c, 1, MSG_DONTWAIT) == 0;
  }

 private:
  std::array<int, 2> fds_{-1, -1};
};

class HttpConnectionGuardTest : public ::testing::Test {
 protected:
  HttpConnectionGuard Make(int max_connections, int max_per_peer = 0) {
    HttpConnectionGuardOptions o;
    o.read_timeout = absl::Seconds(10);
    o.max_connections = max_connections;
    o.max_per_peer = max_per_peer;
    o.on_refused = [this](absl::string_view reason) {
      std::lock_guard lock(mu_);
      reasons_.emplace_back(reason);
    };
    return HttpConnectionGuard(o, [this] { return now_; });
  }
  std::vector<std::string> reasons() {
    std::lock_guard lock(mu_);
    return reasons_;
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  std::mutex mu_;
  std::vector<std::string> reasons_;
};

TEST_F(HttpConnectionGuardTest, ARequestNotReadByTheDeadlineGetsItsSocketShutDown) {
  HttpConnectionGuard guard = Make(8);
  Pair slow, fast;
  guard.Opened(&slow, slow.server(), "10.0.0.1");
  guard.Opened(&fast, fast.server(), "10.0.0.2");
  guard.RequestStarted(&slow);  // its request line: the deadline still runs from the opening
  now_ += absl::Seconds(1);
  guard.RequestRead(&fast);
  now_ += absl::Seconds(8);
  EXPECT_EQ(guard.Sweep(), 0);
  EXPECT_FALSE(slow.Shut());
  now_ += absl::Seconds(1);
  EXPECT_EQ(guard.Sweep(), 1);
  EXPECT_TRUE(slow.Shut());
  EXPECT_FALSE(fast.Shut()) << "a connection being answered has no deadline";
  EXPECT_EQ(guard.Sweep(), 0) << "a socket is shut down once";
  EXPECT_THAT(reasons(), ElementsAre("read_timeout"));
  EXPECT_EQ(guard.open(), 1);
  guard.Closed(&slow);
  EXPECT_EQ(guard.open(), 1);
}

TEST_F(HttpConnectionGuardTest, AKeptAliveConnectionHasNoDeadlineUntilItsNextRequestLine) {
  HttpConnectionGuard guard = Make(8);
  Pair keep_alive;
  guard.Opened(&keep_alive, keep_alive.server(), "10.0.0.1");
  guard.RequestRead(&keep_alive);
  now_ += absl::Seconds(30);  // a long answer (a generation)
  guard.ResponseDone(&keep_alive);
  now_ += absl::Seconds(60);  // idle: the listener's idle timeout governs, not the guard
  EXPECT_EQ(guard.Sweep(), 0);
  guard.RequestStarted(&keep_alive);
  now_ += absl::Seconds(9);
  EXPECT_EQ(guard.Sweep(), 0);
  now_ += absl::Seconds(1);
  EXPECT_EQ(guard.Sweep(), 1);
  EXPECT_TRUE(keep_alive.Shut());
}

TEST_F(HttpConnectionGuardTest, AtTheLimitAnIdleConnectionMakesRoomElseTheLongestReading) {
  HttpConnectionGuard guard = Make(4);
  Pair busy, older, newer, idle, admitted;
  guard.Opened(&busy, busy.server(), "10.0.0.1");  // the oldest, but being answered
  guard.RequestRead(&busy);
  now_ += absl::Seconds(1);
  guard.Opened(&older, older.server(), "10.0.0.2");
  now_ += absl::Seconds(1);
  guard.Opened(&newer, newer.server(), "10.0.0.3");
  guard.Opened(&idle, idle.server(), "10.0.0.4");  // the newest, but idle between requests
  guard.RequestRead(&idle);
  guard.ResponseDone(&idle);
  EXPECT_TRUE(guard.Admit("10.0.0.5"));
  EXPECT_TRUE(idle.Shut());
  EXPECT_FALSE(older.Shut());
  EXPECT_EQ(guard.open(), 3) << "the shut connection no longer counts";
  guard.Opened(&admitted, admitted.server(), "10.0.0.5");
  EXPECT_TRUE(guard.Admit("10.0.0.6"));
  EXPECT_TRUE(older.Shut());
  EXPECT_FALSE(newer.Shut());
  EXPECT_FALSE(busy.Shut());
  EXPECT_THAT(reasons(), ElementsAre("evicted", "evicted"));
}

TEST_F(HttpConnectionGuardTest, AtTheLimitWithEveryConnectionBusyANewOneIsRefused) {
  HttpConnectionGuard guard = Make(2);
  Pair a, b;
  guard.Opened(&a, a.server(), "10.0.0.1");
  guard.Opened(&b, b.server(), "10.0.0.2");
  guard.RequestRead(&a);
  guard.RequestRead(&b);
  EXPECT_FALSE(guard.Admit("10.0.0.3"));
  EXPECT_FALSE(a.Shut());
  EXPECT_FALSE(b.Shut());
  guard.Closed(&b);
  EXPECT_TRUE(guard.Admit("10.0.0.3"));
  EXPECT_THAT(reasons(), ElementsAre("connection_limit"));
}

TEST_F(HttpConnectionGuardTest, ConnectionsPerAddressAreCappedWhenAsked) {
  HttpConnectionGuard capped = Make(100, /*max_per_peer=*/2);
  Pair a, b;
  capped.Opened(&a, a.server(), "10.0.0.1");
  capped.Opened(&b, b.server(), "10.0.0.1");
  EXPECT_FALSE(capped.Admit("10.0.0.1"));
  EXPECT_TRUE(capped.Admit("10.0.0.2"));
  capped.Closed(&a);
  EXPECT_TRUE(capped.Admit("10.0.0.1"));
  EXPECT_THAT(reasons(), ElementsAre("per_ip_limit"));

  HttpConnectionGuard uncapped = Make(100);
  Pair c, d;
  uncapped.Opened(&c, c.server(), "10.0.0.1");
  uncapped.Opened(&d, d.server(), "10.0.0.1");
  EXPECT_TRUE(uncapped.Admit("10.0.0.1"));
}

}  // namespace
}  // namespace specula
