// ClientLimiter and ClientIdentity: the per-client cap of server.limits.max_requests_per_client.
#include "server/client_limiter.h"

#include "gtest/gtest.h"

namespace specula {
namespace {

TEST(ClientLimiterTest, EachClientHasItsOwnCapAndLeasesGiveTheirPlaceBack) {
  ClientLimiter limiter(2);
  auto a1 = limiter.Acquire("a");
  auto a2 = limiter.Acquire("a");
  ASSERT_TRUE(a1.ok() && a2.ok());
  EXPECT_EQ(limiter.Acquire("a").status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(limiter.Acquire("b").ok());  // a temporary: its place is back at once
  EXPECT_EQ(limiter.in_flight("b"), 0);
  {
    ClientLimiter::Lease moved = *std::move(a1);  // a moved lease gives back once
    EXPECT_EQ(limiter.in_flight("a"), 2);
  }
  EXPECT_EQ(limiter.in_flight("a"), 1);
  EXPECT_TRUE(limiter.Acquire("a").ok());
  a2->Reset();
  a2->Reset();  // idempotent
  EXPECT_EQ(limiter.in_flight("a"), 0);
}

TEST(ClientLimiterTest, ZeroMeansNoLimit) {
  ClientLimiter limiter(0);
  std::vector<ClientLimiter::Lease> leases;
  for (int i = 0; i < 100; ++i) leases.push_back(*limiter.Acquire("a"));
  EXPECT_EQ(limiter.in_flight("a"), 0);
}

TEST(ClientIdentityTest, TheTokenWhenAuthenticatingElseTheAddressWithoutItsPort) {
  const std::string bearer = "Bearer abc", lower = "bearer   abc ";
  EXPECT_EQ(ClientIdentity(&bearer, "ipv4:10.0.0.1:5000"), "token abc");
  EXPECT_EQ(ClientIdentity(&lower, "ipv4:10.0.0.2:5000"), "token abc");
  EXPECT_EQ(ClientIdentity(nullptr, "ipv4:10.0.0.1:5000"), "ip 10.0.0.1");
  EXPECT_EQ(ClientIdentity(nullptr, "ipv4:10.0.0.1:6000"), "ip 10.0.0.1");
  EXPECT_EQ(ClientIdentity(nullptr, "ipv6:[::1]:5000"), "ip ::1");
  EXPECT_EQ(ClientIdentity(nullptr, "ipv6:%5B::1%5D:5000"), "ip ::1");  // as gRPC writes it
  EXPECT_EQ(ClientIdentity(nullptr, "ipv6:%5B::1%5D:6000"), "ip ::1");
  // The same client on the HTTP listener (getnameinfo's forms): the same identity.
  EXPECT_EQ(ClientIdentity(nullptr, "::ffff:10.0.0.1"), "ip 10.0.0.1");
  EXPECT_EQ(ClientIdentity(nullptr, "::1"), "ip ::1");  // HTTP's bare IPv6 address
  EXPECT_EQ(ClientIdentity(nullptr, "10.0.0.1"), "ip 10.0.0.1");
  EXPECT_EQ(ClientIdentity(nullptr, ""), "ip ");
}

}  // namespace
}  // namespace specula
