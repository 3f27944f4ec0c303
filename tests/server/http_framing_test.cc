#include "server/http_framing.h"

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace specula {
namespace {

using Headers = std::vector<std::pair<std::string, std::string>>;

int StatusOf(const Headers& headers, const std::string& version = "HTTP/1.1") {
  const auto refusal = CheckRequestHead(version, headers);
  return refusal ? refusal->status : 0;
}

TEST(CheckRequestHeadTest, AcceptsOrdinaryRequests) {
  EXPECT_EQ(StatusOf({{"Host", "x"}}), 0);
  EXPECT_EQ(StatusOf({{"host", "x"}, {"content-length", "0"}, {"X-Odd", "caf\xc3\xa9\t1"}}), 0);
  EXPECT_EQ(StatusOf({{"Host", "x"}, {"Transfer-Encoding", "Chunked"}}), 0);
  EXPECT_EQ(StatusOf({{"Host", "x"}, {"Content-Length", "9223372036854775807"}}), 0);
  EXPECT_EQ(StatusOf({}, "HTTP/1.0"), 0);  // Host is HTTP/1.1's requirement
}

TEST(CheckRequestHeadTest, RefusesTheSmugglingPairs) {
  EXPECT_EQ(StatusOf({{"Host", "x"}, {"Content-Length", "36"}, {"Transfer-Encoding", "chunked"}}),
            400);
  EXPECT_EQ(StatusOf({{"Host", "x"}, {"Transfer-Encoding", "chunked"}, {"content-length", "3"}}),
            400);
  EXPECT_EQ(StatusOf({{"Host", "x"}, {"Content-Length", "2"}, {"Content-Length", "40"}}), 400);
  EXPECT_EQ(StatusOf({{"Host", "x"}, {"Content-Length", "2"}, {"Content-Length", "2"}}), 400);
  EXPECT_EQ(StatusOf({{"Host", "x"}, {"Content-Length", "2, 2"}}), 400);
  // "Transfer-Encoding : chunked": the name keeps the space and is no token.
  EXPECT_EQ(StatusOf({{"Host", "x"}, {"Transfer-Encoding ", "chunked"}}), 400);
  EXPECT_EQ(StatusOf({{"Transfer-Encoding", "chunked"}}, "HTTP/1.0"), 400);
}

TEST(CheckRequestHeadTest, RefusesBadLengthsAndUnknownCodings) {
  for (const char* length :
       {"-1", "12abc", "", " ", "+5", "0x10", "18446744073709551616", "99999999999999999999"}) {
    EXPECT_EQ(StatusOf({{"Host", "x"}, {"Content-Length", length}}), 400) << length;
  }
  for (const char* coding :
       {"chunked, identity", "xchunked", "gzip, chunked", "identity", "chunked, chunked", ""}) {
    EXPECT_EQ(StatusOf({{"Host", "x"}, {"Transfer-Encoding", coding}}), 501) << coding;
  }
  EXPECT_EQ(
      StatusOf({{"Host", "x"}, {"Transfer-Encoding", "chunked"}, {"Transfer-Encoding", "chunked"}}),
      501);
}

TEST(CheckRequestHeadTest, RefusesMalformedFields) {
  EXPECT_EQ(StatusOf({}), 400);                              // HTTP/1.1 without Host
  EXPECT_EQ(StatusOf({{"Host", "a"}, {"host", "b"}}), 400);  // two
  EXPECT_EQ(StatusOf({{"Host", "x"}, {"X-A", std::string("a\0b", 3)}}), 400);
  EXPECT_EQ(StatusOf({{"Host", "x"}, {"X-A", "a\rb"}}), 400);
  EXPECT_EQ(StatusOf({{"Host", "x"}, {"X-A", "a\x7f"}}), 400);
  EXPECT_EQ(StatusOf({{"Host", "x"}, {"", "v"}}), 400);
  EXPECT_EQ(StatusOf({{"Host", "x"}, {"X A", "v"}}), 400);
  EXPECT_EQ(StatusOf({{"Host", "x"}, {"X:A", "v"}}), 400);
}

}  // namespace
}  // namespace specula
