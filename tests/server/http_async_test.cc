// Asynchronous and streamed answers of the HTTP listener (HttpExchange): a handler that answers
// later from another thread, a chunked stream written piece by piece, and a client that hangs up
// while its connection is parked, which the route must hear at once (it cancels a generation).
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/http_server.h"
#include "tests/server/prometheus_scrape.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

// Exchanges handed out by the routes, for the test to answer from its own thread. std::mutex,
// not absl::Mutex: the ThreadSanitizer run sees only what is instrumented, and Debian's Abseil
// is not.
struct Parked {
  std::mutex mu;
  std::condition_variable changed;
  std::vector<std::shared_ptr<HttpExchange>> exchanges;  // guarded by mu
  int gone_count = 0;                                    // hang-ups heard; guarded by mu
  void Gone() {
    std::lock_guard lock(mu);
    ++gone_count;
    changed.notify_all();
  }
  void WaitGone() {
    std::unique_lock lock(mu);
    changed.wait(lock, [&] { return gone_count > 0; });
  }
  int gone() {
    std::lock_guard lock(mu);
    return gone_count;
  }
};

std::unique_ptr<HttpServer> StartAsyncServer(Parked* parked,
                                             const HttpServerOptions& options = {}) {
  std::vector<HttpRoute> routes;
  HttpRoute later{"/later", {"POST"}, nullptr};
  later.async_handler = [parked](const HttpRequest& r, std::shared_ptr<HttpExchange> ex) {
    ex->OnClientGone([parked] { parked->Gone(); });
    if (r.header("x-session-id") != nullptr) {
      ex->Respond({200, "text/plain", *r.header("x-session-id"), {}});
      return;
    }
    std::lock_guard lock(parked->mu);
    parked->exchanges.push_back(ex);
    parked->changed.notify_all();
  };
  routes.push_back(std::move(later));
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start("127.0.0.1:0", std::move(routes), options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// The first exchange the routes parked.
// The `n`th exchange a route parked (1-based), once there.
std::shared_ptr<HttpExchange> WaitForExchange(Parked* parked, size_t n = 1) {
  std::unique_lock lock(parked->mu);
  parked->changed.wait(lock, [&] { return parked->exchanges.size() >= n; });
  return parked->exchanges[n - 1];
}

TEST(HttpAsyncTest, AnswersFromAnotherThreadAfterTheHandlerReturned) {
  Parked parked;
  auto server = StartAsyncServer(&parked);
  ASSERT_NE(server, nullptr);
  std::future<std::string> reply = std::async(std::launch::async, [&] {
    return testing::HttpExchange(server->port(), testing::HttpRequestText("POST", "/later", "{}"));
  });
  std::shared_ptr<HttpExchange> ex = WaitForExchange(&parked);
  std::thread([ex] { ex->Respond({201, "application/json", "{\"ok\":true}", {}}); }).join();
  const std::string r = reply.get();
  EXPECT_EQ(testing::HttpStatus(r), 201);
  EXPECT_EQ(testing::HttpBody(r), "{\"ok\":true}");
  EXPECT_EQ(parked.gone(), 0);
}

TEST(HttpAsyncTest, HandlerMayAnswerBeforeReturningAndSeesHeaders) {
  Parked parked;
  auto server = StartAsyncServer(&parked);
  ASSERT_NE(server, nullptr);
  const std::string r = testing::HttpExchange(
      server->port(),
      "POST /later HTTP/1.1\r\nHost: x\r\nX-Session-Id: abc\r\nContent-Length: "
      "0\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(testing::HttpStatus(r), 200);
  EXPECT_EQ(testing::HttpBody(r), "abc");
}

TEST(HttpAsyncTest, StreamsChunksAsTheyAreWritten) {
  Parked parked;
  auto server = StartAsyncServer(&parked);
  ASSERT_NE(server, nullptr);
  const int fd = testing::ConnectLoopback(server->port());
  const std::string request = testing::HttpRequestText("POST", "/later", "{}");
  ASSERT_EQ(::send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  std::shared_ptr<HttpExchange> ex = WaitForExchange(&parked);
  ex->StartStream(200, "text/event-stream");
  ex->Write("data: one\n\n");
  // The first piece reaches the client while the stream is still open: read until it is there.
  std::string got;
  char buf[4096];
  while (got.find("data: one") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    ASSERT_GT(n, 0) << "connection closed before the first chunk";
    got.append(buf, static_cast<size_t>(n));
  }
  EXPECT_THAT(got, HasSubstr("Transfer-Encoding: chunked"));
  EXPECT_THAT(got, ::testing::Not(HasSubstr("data: two")));
  ex->Write("data: two\n\n");
  ex->End();
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) {
    got.append(buf, static_cast<size_t>(n));
    if (got.find("\r\n0\r\n\r\n") != std::string::npos) break;  // the last chunk
  }
  ::close(fd);
  EXPECT_THAT(got, HasSubstr("data: two"));
  EXPECT_THAT(got, HasSubstr("\r\n0\r\n\r\n"));
  EXPECT_EQ(parked.gone(), 0);
}

TEST(HttpAsyncTest, AHangUpWhileParkedIsReportedAtOnce) {
  Parked parked;
  auto server = StartAsyncServer(&parked);
  ASSERT_NE(server, nullptr);
  const int fd = testing::ConnectLoopback(server->port());
  const std::string request = testing::HttpRequestText("POST", "/later", "{}");
  ASSERT_EQ(::send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  std::shared_ptr<HttpExchange> ex = WaitForExchange(&parked);
  ::close(fd);
  // Nothing is written to the connection: only the watcher can notice.
  parked.WaitGone();
  // Answering afterwards is harmless, and the server keeps serving.
  ex->Respond({200, "text/plain", "late", {}});
  std::future<std::string> reply = std::async(std::launch::async, [&] {
    return testing::HttpExchange(server->port(),
                                 "POST /later HTTP/1.1\r\nHost: x\r\nX-Session-Id: next\r\n"
                                 "Content-Length: 0\r\nConnection: close\r\n\r\n");
  });
  EXPECT_EQ(testing::HttpBody(reply.get()), "next");
}

TEST(HttpAsyncTest, AHangUpDuringAStreamIsReported) {
  Parked parked;
  auto server = StartAsyncServer(&parked);
  ASSERT_NE(server, nullptr);
  const int fd = testing::ConnectLoopback(server->port());
  const std::string request = testing::HttpRequestText("POST", "/later", "{}");
  ASSERT_EQ(::send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  std::shared_ptr<HttpExchange> ex = WaitForExchange(&parked);
  ex->StartStream(200, "text/event-stream");
  ex->Write("data: one\n\n");
  char buf[4096];
  ASSERT_GT(::recv(fd, buf, sizeof(buf), 0), 0);
  ::close(fd);
  parked.WaitGone();
  ex->Write("data: ignored\n\n");
  ex->End();
}

// Reads from `fd` until the last chunk of a chunked body; what came, or less if it closed first.
std::string ReadToLastChunk(int fd) {
  std::string got;
  std::vector<char> buf(1 << 16);
  for (ssize_t n; (n = ::recv(fd, buf.data(), buf.size(), 0)) > 0;) {
    got.append(buf.data(), static_cast<size_t>(n));
    if (absl::EndsWith(got, "\r\n0\r\n\r\n")) break;
  }
  return got;
}

// Sends a keep-alive POST /later and returns its socket, once the route has parked the exchange.
int OpenStream(const HttpServer& server, Parked* parked, std::shared_ptr<HttpExchange>* ex) {
  const int fd = testing::ConnectLoopback(server.port());
  const std::string request = "POST /later HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
  EXPECT_EQ(::send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  *ex = WaitForExchange(parked);
  (*ex)->StartStream(200, "text/event-stream");
  return fd;
}

HttpServerOptions OneSecondIdle(int stream_stall_seconds) {
  HttpServerOptions options;
  options.idle_timeout_seconds = 1;
  options.stream_stall_seconds = stream_stall_seconds;
  return options;
}

// A client may pause reading a stream longer than the idle timeout (the hostile round saw SSE
// streams cut after 12 s pauses with 2.8 MB buffered, where gRPC streams lived on): with the
// socket buffers full nothing moves, yet the connection is not idle. Once the answer is whole,
// the idle timeout applies again to the kept-alive connection.
TEST(HttpAsyncTest, AStreamOutlivesAClientPauseLongerThanTheIdleTimeout) {
  Parked parked;
  auto server = StartAsyncServer(&parked, OneSecondIdle(60));
  ASSERT_NE(server, nullptr);
  std::shared_ptr<HttpExchange> ex;
  const int fd = OpenStream(*server, &parked, &ex);
  const std::string piece = "data: " + std::string(64 * 1024 - 8, 'x') + "\n\n";
  constexpr int kPieces = 256;  // 16 MiB: far more than loopback's socket buffers hold
  for (int i = 0; i < kPieces; ++i) ex->Write(piece);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // the pause under test
  ex->End();
  const std::string got = ReadToLastChunk(fd);
  EXPECT_TRUE(absl::EndsWith(got, "\r\n0\r\n\r\n")) << "cut after " << got.size() << " bytes";
  EXPECT_GE(got.size(), kPieces * piece.size());
  EXPECT_EQ(parked.gone(), 0);
  // Kept alive and idle now: closed by the one-second idle timeout, not the minute's stall bound.
  const timeval wait{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
  char byte;
  EXPECT_EQ(::recv(fd, &byte, 1, 0), 0);
  ::close(fd);
}

// A client that stops reading for good is closed after the stall bound, and the route hears it
// (a generation would be cancelled).
TEST(HttpAsyncTest, AStreamWhoseClientNeverReadsIsClosedAfterTheStallBound) {
  Parked parked;
  auto server = StartAsyncServer(&parked, OneSecondIdle(3));
  ASSERT_NE(server, nullptr);
  std::shared_ptr<HttpExchange> ex;
  const int fd = OpenStream(*server, &parked, &ex);
  const auto start = std::chrono::steady_clock::now();
  const std::string piece(1 << 20, 'x');
  for (int i = 0; i < 16; ++i) ex->Write(piece);
  parked.WaitGone();
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(2500));
  ::close(fd);
}

// Stopping the listener with connections parked (a request not answered yet, a stream between
// two writes) closes them (libmicrohttpd aborted the process on a suspended connection), and
// their routes hear the clients are gone.
// The exchanges outlive the server, and answering them afterwards does nothing.
TEST(HttpAsyncTest, StoppingWithParkedConnectionsClosesThem) {
  Parked parked;
  auto server = StartAsyncServer(&parked);
  ASSERT_NE(server, nullptr);
  const std::string request = testing::HttpRequestText("POST", "/later", "{}");
  const int waiting_fd = testing::ConnectLoopback(server->port());
  ASSERT_EQ(::send(waiting_fd, request.data(), request.size(), 0),
            static_cast<ssize_t>(request.size()));
  std::shared_ptr<HttpExchange> waiting = WaitForExchange(&parked);
  const int stream_fd = testing::ConnectLoopback(server->port());
  ASSERT_EQ(::send(stream_fd, request.data(), request.size(), 0),
            static_cast<ssize_t>(request.size()));
  std::shared_ptr<HttpExchange> stream = WaitForExchange(&parked, 2);
  stream->StartStream(200, "text/event-stream");
  stream->Write("data: one\n\n");
  char buf[4096];
  ASSERT_GT(::recv(stream_fd, buf, sizeof(buf), 0), 0);  // the stream is parked after its write
  server.reset();
  // Both routes heard that their clients are gone (a generation would be cancelled)...
  EXPECT_EQ(parked.gone(), 2);
  // ...and both connections were closed by the server (recv sees the end, not a hang).
  for (const int fd : {waiting_fd, stream_fd}) {
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) {
    }
    EXPECT_EQ(n, 0);
    ::close(fd);
  }
  waiting->Respond({200, "text/plain", "too late", {}});
  stream->Write("data: two\n\n");
  stream->End();
}

}  // namespace
}  // namespace specula
