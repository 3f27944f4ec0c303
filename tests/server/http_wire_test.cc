// The bytes of the listener's responses: what a client's parser relies on (one status line,
// exactly one framing header, Date) and what a route must not be able to break (a header value
// with CR LF would split the response; a route's own Content-Length would contradict the body).
#include "server/http_wire.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specula {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr absl::Time kSomeTime = absl::FromUnixSeconds(784111777);  // RFC 9110's example date

HttpResponse Answer(int status, std::vector<std::pair<std::string, std::string>> headers = {}) {
  HttpResponse r;
  r.status = status;
  r.content_type = "application/json";
  r.body = "{}";
  r.headers = std::move(headers);
  return r;
}

TEST(HttpWireTest, AWholeAnswerHasOneStatusLineItsLengthAndADate) {
  ResponseHeadOptions options;
  options.content_length = 2;
  options.now = kSomeTime;
  EXPECT_EQ(ResponseHead(Answer(200, {{"X-Request-Id", "7"}}), options),
            "HTTP/1.1 200 OK\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
            "Content-Type: application/json\r\nContent-Length: 2\r\nX-Request-Id: 7\r\n\r\n");
  options.close = true;
  EXPECT_THAT(ResponseHead(Answer(404), options),
              AllOf(StartsWith("HTTP/1.1 404 Not Found\r\n"), HasSubstr("Connection: close\r\n")));
}

TEST(HttpWireTest, AStreamIsChunkedAndAnHttp10StreamEndsWithTheConnection) {
  ResponseHeadOptions options;
  options.framing = BodyFraming::kChunked;
  const std::string chunked = ResponseHead(Answer(200), options);
  EXPECT_THAT(chunked, HasSubstr("Transfer-Encoding: chunked\r\n"));
  EXPECT_THAT(chunked, Not(HasSubstr("Content-Length")));
  EXPECT_THAT(chunked, Not(HasSubstr("Connection")));
  options.framing = BodyFraming::kClose;
  const std::string until_close = ResponseHead(Answer(200), options);
  EXPECT_THAT(until_close, Not(HasSubstr("Transfer-Encoding")));
  EXPECT_THAT(until_close, Not(HasSubstr("Content-Length")));
  EXPECT_THAT(until_close, HasSubstr("Connection: close\r\n"));
}

TEST(HttpWireTest, RouteHeadersCannotSplitTheResponseOrContradictItsFraming) {
  ResponseHeadOptions options;
  options.content_length = 2;
  const std::string head = ResponseHead(Answer(200, {{"X-Evil", "a\r\nSet-Cookie: x=1"},
                                                     {"Bad Name", "v"},
                                                     {"content-length", "99"},
                                                     {"Transfer-Encoding", "chunked"},
                                                     {"X-Nul", std::string("a\0b", 3)},
                                                     {"X-Fine", "ok"}}),
                                        options);
  EXPECT_THAT(head, Not(HasSubstr("Set-Cookie")));
  EXPECT_THAT(head, Not(HasSubstr("Bad Name")));
  EXPECT_THAT(head, Not(HasSubstr("99")));
  EXPECT_THAT(head, Not(HasSubstr("Transfer-Encoding")));
  EXPECT_THAT(head, Not(HasSubstr("X-Nul")));
  EXPECT_THAT(head, HasSubstr("X-Fine: ok\r\n"));
  EXPECT_THAT(head, HasSubstr("Content-Length: 2\r\n"));
}

TEST(HttpWireTest, ARoutesConnectionCloseIsKeptAndHonoured) {
  const HttpResponse closing = Answer(400, {{"Connection", "close"}});
  EXPECT_TRUE(AsksToClose(closing));
  EXPECT_FALSE(AsksToClose(Answer(200, {{"Connection", "keep-alive"}})));
  EXPECT_TRUE(AsksToClose(Closing(Answer(200))));
  const std::string head = ResponseHead(closing, ResponseHeadOptions{});
  EXPECT_THAT(head, HasSubstr("Connection: close\r\n"));
  EXPECT_EQ(head.find("Connection"), head.rfind("Connection"));  // once
}

TEST(HttpWireTest, ChunksAreHexSizedAndAnEmptyWriteIsNoChunk) {
  EXPECT_EQ(Chunk("data: {}\n\n"), "a\r\ndata: {}\n\n\r\n");
  EXPECT_EQ(Chunk(std::string(300, 'x')).substr(0, 5), "12c\r\n");
  EXPECT_EQ(Chunk(""), "");
  EXPECT_EQ(kLastChunk, "0\r\n\r\n");
}

}  // namespace
}  // namespace specula
