#include "server/http_connection.h"

#include <sys/socket.h>

// clang-format off
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/stream_traits.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
// clang-format on

#include <chrono>
#include <cstdint>
#include <exception>
#include <limits>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/common/hex_digits.h"
#include "engine/common/log.h"
#include "server/connection_watcher.h"
#include "server/http_body.h"
#include "server/http_connection_guard.h"
#include "server/http_exchange_state.h"
#include "server/http_framing.h"
#include "server/http_server.h"
#include "server/http_tls.h"
#include "server/http_wire.h"

namespace specula {

namespace net = boost::asio;
namespace http = boost::beast::http;
using boost::system::error_code;
using net::awaitable;
using net::ip::tcp;

namespace {

// A request head past this is refused (431): far beyond any real client's.
constexpr size_t kMaxHeadBytes = 32 << 10;
// Writes go out in pieces of at most this, each with the stall bound: a client reading slowly
// but steadily is never cut, one that stops is cut after the bound.
constexpr size_t kWritePiece = 256 << 10;
// A connection that closes after its answer reads (and drops) what the client still sends for
// at most this long, so the client reads the answer before any reset.
constexpr auto kLingerTime = std::chrono::seconds(1);

auto Redirect(error_code& ec) { return net::redirect_error(net::use_awaitable, ec); }

// A deadline on a socket: when it passes, the socket is shut down (never closed: its descriptor
// stays valid until its owner closes it), which ends whatever read or write was pending.
class Deadline {
 public:
  Deadline(const net::any_io_executor& executor, int fd)
      : timer_(executor), fd_(fd), generation_(std::make_shared<uint64_t>(0)) {}
  void Arm(std::chrono::steady_clock::duration after) {
    timer_.expires_after(after);
    // A wait that completed just before a Disarm may still run: its generation is then stale.
    timer_.async_wait(
        [fd = fd_, generation = generation_, armed = ++*generation_](const error_code& ec) {
          if (!ec && *generation == armed) ::shutdown(fd, SHUT_RDWR);
        });
  }
  void Disarm() {
    ++*generation_;
    timer_.cancel();
  }
  // A wait already completed but not yet run must not shut down a descriptor closed after this.
  ~Deadline() { ++*generation_; }

 private:
  net::steady_timer timer_;
  const int fd_;
  std::shared_ptr<uint64_t> generation_;  // touched on the connection's strand only
};

// The route label of on_answered.
std::string RouteLabel(const HttpRoute* route) {
  if (route == nullptr) return "none";
  return route->with_id ? route->path + "{id}" : route->path;
}

// Runs a handler; an exception must not end the connection's coroutine. False (logged) when it
// threw: the caller answers 500.
bool RunGuarded(const HttpRequest& request, const std::function<void()>& handler) {
  try {
    handler();
    return true;
  } catch (const std::exception& e) {
    Log(LogLevel::kError, "http_handler_failed", {{"path", request.path}, {"error", e.what()}});
  } catch (...) {
    Log(LogLevel::kError, "http_handler_failed", {{"path", request.path}});
  }
  return false;
}

// Whether a head read failed on the request's bytes (an answer is owed: 400, or 431 for a head
// too large) rather than on the connection (closed, shut down, reset: nobody to answer).
bool IsMalformed(const error_code& ec) {
  if (ec.category() != make_error_code(http::error::bad_target).category()) return false;
  return ec != http::error::end_of_stream && ec != http::error::partial_message &&
         ec != http::error::need_more && ec != http::error::need_buffer;
}

// The request line's version as CheckRequestHead takes it; "" for one other than 1.0 and 1.1.
std::string VersionString(unsigned version) {
  if (version == 10) return "HTTP/1.0";
  if (version == 11) return "HTTP/1.1";
  return "";
}

// A request target's path, percent-escapes decoded, except that %00 stays as written (a NUL
// would end the path routes are matched on too early; no route has it, so it is a 404).
std::string PathOf(std::string_view target) {
  target = target.substr(0, target.find('?'));
  std::string path;
  path.reserve(target.size());
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i] == '%' && i + 2 < target.size()) {
      const int hi = HexDigitValue(target[i + 1]), lo = HexDigitValue(target[i + 2]);
      if (hi >= 0 && lo >= 0 && hi * 16 + lo != 0) {
        path += static_cast<char>(hi * 16 + lo);
        i += 2;
        continue;
      }
    }
    path += target[i];
  }
  return path;
}

}  // namespace

template <class Stream>
class HttpConnection {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, tcp::socket>;

  // `keep` lives as long as the stream (a TLS stream's context).
  HttpConnection(const HttpServer& server, Stream stream, std::string peer,
                 std::shared_ptr<void> keep = nullptr)
      : server_(server),
        options_(server.options_),
        guard_(*server.guard_),
        keep_(std::move(keep)),
        stream_(std::move(stream)),
        fd_(Socket().native_handle()),
        deadline_(stream_.get_executor(), fd_),
        peer_(std::move(peer)) {
    guard_.Opened(this, fd_, peer_);
  }
  // The guard forgets the connection before its descriptor is closed (the stream's destruction).
  ~HttpConnection() { guard_.Closed(this); }
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  awaitable<void> Serve() {
    if constexpr (kTls) {
      error_code ec;  // the guard's read deadline bounds the handshake
      co_await stream_.async_handshake(net::ssl::stream_base::server, Redirect(ec));
      if (ec) co_return;
    }
    // Each co_await stands alone: GCC 12 miscompiles co_await inside && (it traps).
    for (;;) {
      const bool begun = co_await NextRequestBegins();
      if (!begun) break;
      const bool kept = co_await ServeRequest();
      if (!kept) break;
    }
    co_await CloseGracefully();
  }

 private:
  tcp::socket& Socket() { return boost::beast::get_lowest_layer(stream_); }

  // Waits (the idle timeout) for the first bytes of the next request, unless they are read.
  awaitable<bool> NextRequestBegins() {
    if (buffer_.size() == 0) {
      deadline_.Arm(std::chrono::seconds(options_.idle_timeout_seconds));
      error_code ec;
      const size_t n = co_await stream_.async_read_some(buffer_.prepare(16 << 10), Redirect(ec));
      deadline_.Disarm();
      if (ec) co_return false;
      buffer_.commit(n);
    }
    guard_.RequestStarted(this);
    co_return true;
  }

  // Reads the request's head (`whole`: the rest of the request), each read bounded by the idle
  // timeout: a client that stops sending is closed after it, as between requests (the guard's
  // read deadline bounds the whole request however steadily it trickles).
  awaitable<error_code> ReadSome(http::request_parser<CappedStringBody>& parser, bool whole) {
    error_code ec;
    while (!ec && !(whole ? parser.is_done() : parser.is_header_done())) {
      deadline_.Arm(std::chrono::seconds(options_.idle_timeout_seconds));
      co_await http::async_read_some(stream_, buffer_, parser, Redirect(ec));
      deadline_.Disarm();
    }
    co_return ec;
  }

  // Reads, routes and answers one request; false when the connection is to close.
  awaitable<bool> ServeRequest() {
    http::request_parser<CappedStringBody> parser;
    parser.header_limit(kMaxHeadBytes);
    // No limit of Beast's own: a declared length over max_body_bytes gets the 413 (RefuseHead),
    // and CappedStringBody bounds a chunked body.
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    parser.get().body().limit = options_.max_body_bytes;
    error_code ec = co_await ReadSome(parser, /*whole=*/false);
    if (ec) {
      if (IsMalformed(ec)) co_await RefuseMalformed(ec);
      co_return false;
    }
    version_ = parser.get().version();
    HttpRequest request = RequestOf(parser.get());
    const HttpRoute* route = nullptr;
    if (std::optional<HttpResponse> refusal = RefuseHead(request, parser, &route)) {
      // Its body is not read: where the next request would begin is unknown.
      const bool close = !parser.is_done();
      const Outcome outcome = co_await Send(*refusal, request, route, close || !KeepsAlive(parser));
      co_return outcome == Outcome::kKeep;
    }
    const bool read = co_await ReadBody(parser, request);
    if (!read) co_return false;
    const bool close = !KeepsAlive(parser);
    if (route->async_handler) {
      const bool kept = co_await ServeAsync(*route, request, close);
      co_return kept;
    }
    HttpResponse response;
    if (!RunGuarded(request, [&] { response = route->handler(request); })) {
      response = server_.Refusal(500, "internal error");
    }
    const Outcome outcome = co_await Send(response, request, route, close);
    co_return outcome == Outcome::kKeep;
  }

  // HTTP/1.1 without "Connection: close" (an HTTP/1.0 connection always closes after its answer).
  static bool KeepsAlive(const http::request_parser<CappedStringBody>& parser) {
    return parser.keep_alive() && parser.get().version() == 11;
  }

  HttpRequest RequestOf(const http::request<CappedStringBody>& head) const {
    HttpRequest request;
    request.method = std::string(head.method_string());
    request.path = PathOf(std::string_view(head.target().data(), head.target().size()));
    request.peer = peer_;
    for (const auto& field : head) {
      request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    }
    return request;
  }

  // The refusal of a request on its head alone, before any body is read (in this order: framing
  // and fields, client certificate, credentials, path and method, declared size), else nullopt
  // and `route` set. Names in `request.headers` are lower-cased once the head passed.
  std::optional<HttpResponse> RefuseHead(HttpRequest& request,
                                         const http::request_parser<CappedStringBody>& parser,
                                         const HttpRoute** route) {
    const std::string version = VersionString(parser.get().version());
    if (version.empty()) {
      server_.ReportRefused("malformed");
      return Closing(server_.Refusal(505, "only HTTP/1.0 and HTTP/1.1 are served"));
    }
    // Where the next request would begin is unknown after these: the connection closes.
    if (std::optional<HeadRefusal> refusal = CheckRequestHead(version, request.headers)) {
      server_.ReportRefused("malformed");
      return Closing(server_.Refusal(refusal->status, refusal->reason));
    }
    for (auto& [name, value] : request.headers) absl::AsciiStrToLower(&name);
    if (absl::Status s = CheckClientCertificate(); !s.ok()) {
      return server_.Refusal(403, std::string(s.message()));
    }
    if (std::optional<HttpResponse> refusal = server_.Authenticate(request)) {
      server_.ReportRefused("unauthenticated");
      return refusal;
    }
    HttpResponse refusal;
    *route = server_.Match(request, &refusal);
    if (*route == nullptr) return refusal;
    if (parser.content_length().value_or(0) > options_.max_body_bytes) {
      server_.ReportRefused("body_too_large");
      return server_.TooLarge();
    }
    return std::nullopt;
  }

  absl::Status CheckClientCertificate() {
    if constexpr (kTls) {
      if (options_.tls != nullptr) return options_.tls->CheckClient(stream_.native_handle());
    }
    return absl::OkStatus();
  }

  // Reads the body (after a 100 Continue when the client waits for one). False when the
  // connection is to close: it failed, or a chunked body outgrew the limit (answered 413).
  awaitable<bool> ReadBody(http::request_parser<CappedStringBody>& parser, HttpRequest& request) {
    error_code ec;
    if (!parser.is_done()) {
      // RFC 9110 10.1.1: an HTTP/1.0 client's expectation is ignored.
      if (const std::string* expect = request.header("expect");
          expect != nullptr && version_ == 11 && absl::EqualsIgnoreCase(*expect, "100-continue")) {
        const bool written = co_await Write("HTTP/1.1 100 Continue\r\n\r\n");
        if (!written) co_return false;
      }
      ec = co_await ReadSome(parser, /*whole=*/true);
    }
    // Past the limit and kMaxDropped more: closed without an answer.
    if (ec) co_return false;
    guard_.RequestRead(this);
    CappedStringBody::value_type& body = parser.get().body();
    if (body.dropped > 0) {
      server_.ReportRefused("body_too_large");
      const HttpResponse too_large = server_.TooLarge();
      co_await Send(too_large, request, nullptr, /*close=*/true);
      co_return false;
    }
    request.body = std::move(body.data);
    co_return true;
  }

  // Answers a head Beast could not parse, then the connection closes.
  awaitable<void> RefuseMalformed(const error_code& ec) {
    server_.ReportRefused("malformed");
    HttpRequest none;
    const HttpResponse refusal =
        ec == http::error::header_limit
            ? server_.Refusal(
                  431, absl::StrCat("the request head is larger than ", kMaxHeadBytes, " bytes"))
            : server_.Refusal(400, absl::StrCat("malformed request: ", ec.message()));
    co_await Send(refusal, none, nullptr, /*close=*/true);
  }

  // How an answer went: not written whole (the client is gone), or written and the connection
  // closes or is kept for the next request.
  enum class Outcome { kFailed, kClose, kKeep };
  static Outcome OutcomeOf(bool written, bool close, const HttpResponse& response) {
    if (!written) return Outcome::kFailed;
    return close || AsksToClose(response) ? Outcome::kClose : Outcome::kKeep;
  }

  // The answer is over (`status` sent, 0 when none was): the guard and the server's report hear.
  void Answered(const HttpRoute* route, int status) {
    guard_.ResponseDone(this);
    server_.ReportAnswered(RouteLabel(route), status);
  }

  // Writes a whole answer and reports it.
  awaitable<Outcome> Send(const HttpResponse& response, const HttpRequest& request,
                          const HttpRoute* route, bool close) {
    ResponseHeadOptions head;
    head.content_length = response.body.size();
    head.close = close;
    std::string out = ResponseHead(response, head);
    if (request.method != "HEAD") out += response.body;
    const bool written = co_await Write(out);
    Answered(route, written ? response.status : 0);
    co_return OutcomeOf(written, close, response);
  }

  // An asynchronous route: the handler starts the work; the answer comes through the exchange,
  // while the connection waits (watched for a hang-up).
  awaitable<bool> ServeAsync(const HttpRoute& route, const HttpRequest& request, bool close) {
    auto timer = std::make_shared<net::steady_timer>(stream_.get_executor());
    timer->expires_at(net::steady_timer::time_point::max());
    auto state = std::make_shared<HttpExchangeState>();
    state->gate = server_.gate_;
    state->wake = [timer, executor = stream_.get_executor()] {
      net::post(executor, [timer] { timer->cancel(); });
    };
    state->watcher = server_.watcher_.get();
    WatchForHangUp(state, fd_);
    server_.Register(state);
    // Should anything below throw, the route still hears that its client is gone.
    absl::Cleanup abandoned = [&state] { FinishExchange(*state, /*completed=*/false); };
    auto exchange = std::make_shared<HttpExchange>(state);
    if (!RunGuarded(request, [&] { route.async_handler(request, exchange); })) {
      exchange->Respond(server_.Refusal(500, "internal error"));
    }
    HttpExchangeState::Mode mode;
    while ((mode = ModeOf(*state)) == HttpExchangeState::Mode::kWaiting && !GoneOf(*state)) {
      error_code ec;
      co_await timer->async_wait(Redirect(ec));
    }
    StopWatchingForHangUp(*state);
    Outcome outcome = Outcome::kFailed;
    if (GoneOf(*state)) {
      Answered(&route, 0);
    } else if (mode == HttpExchangeState::Mode::kFull) {
      // Nothing writes the response once its mode is set: read unlocked.
      outcome = co_await Send(state->response, request, &route, close);
    } else {
      outcome = co_await StreamAnswer(state, *timer, request, route, close);
    }
    // A HEAD request's stream ends with its head: the route's work is for nobody.
    const bool completed = outcome != Outcome::kFailed &&
                           !(mode == HttpExchangeState::Mode::kStream && request.method == "HEAD");
    std::move(abandoned).Cancel();
    FinishExchange(*state, completed);
    co_return outcome == Outcome::kKeep;
  }

  static HttpExchangeState::Mode ModeOf(HttpExchangeState& state) {
    std::lock_guard lock(state.mu);
    return state.mode;
  }
  static bool GoneOf(HttpExchangeState& state) {
    std::lock_guard lock(state.mu);
    return state.gone;
  }

  // A streamed answer: the head, then what the route writes, coalesced while a write is in
  // flight, in chunks (to an HTTP/1.0 client: as it is, and the connection closes after it).
  awaitable<Outcome> StreamAnswer(const std::shared_ptr<HttpExchangeState>& shared,
                                  net::steady_timer& wake, const HttpRequest& request,
                                  const HttpRoute& route, bool close) {
    HttpExchangeState& state = *shared;
    ResponseHeadOptions head;
    const bool http10 = version_ == 10;
    head.framing = http10 ? BodyFraming::kClose : BodyFraming::kChunked;
    head.close = close;
    // Arguments of a co_await call are named: GCC 12 mishandles temporaries that live across a
    // suspension (freed twice).
    const std::string head_bytes = ResponseHead(state.response, head);
    bool ok = co_await Write(head_bytes);
    const bool head_only = request.method == "HEAD";
    while (ok && !head_only) {
      std::string out;
      bool ended, gone;
      {
        std::lock_guard lock(state.mu);
        out.swap(state.pending);
        ended = state.ended;
        gone = state.gone;
      }
      if (gone) {
        ok = false;
      } else if (!out.empty()) {
        const std::string framed = http10 ? std::move(out) : Chunk(out);
        ok = co_await Write(framed);
      } else if (ended) {
        if (!http10) ok = co_await Write(kLastChunk);
        break;
      } else {
        WatchForHangUp(shared, fd_);
        error_code ec;
        co_await wake.async_wait(Redirect(ec));
        StopWatchingForHangUp(state);
      }
    }
    Answered(&route, state.response.status);
    co_return OutcomeOf(ok, close, state.response);
  }

  // Writes `data` in pieces, each bounded by the stall bound; false when the connection failed.
  awaitable<bool> Write(std::string_view data) {
    for (size_t at = 0; at < data.size(); at += kWritePiece) {
      const std::string_view piece = data.substr(at, kWritePiece);
      if (options_.stream_stall_seconds > 0) {
        deadline_.Arm(std::chrono::seconds(options_.stream_stall_seconds));
      }
      error_code ec;
      co_await net::async_write(stream_, net::buffer(piece.data(), piece.size()), Redirect(ec));
      deadline_.Disarm();
      if (ec) co_return false;
    }
    co_return true;
  }

  // Ends the connection: no more is sent, and what the client still sends is read and dropped
  // for a moment, so that it reads the last answer rather than a reset.
  awaitable<void> CloseGracefully() {
    error_code ec;
    deadline_.Arm(kLingerTime);
    if constexpr (kTls) {
      // close_notify, so that a body delimited by the close (HTTP/1.0) is known to be whole.
      co_await stream_.async_shutdown(Redirect(ec));
      ec = {};
    }
    Socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) {
      deadline_.Disarm();
      co_return;
    }
    char scratch[4096];
    while (!ec) {
      co_await Socket().async_read_some(net::buffer(scratch), Redirect(ec));
    }
    deadline_.Disarm();
  }

  const HttpServer& server_;
  const HttpServerOptions& options_;
  HttpConnectionGuard& guard_;
  const std::shared_ptr<void> keep_;  // declared before the stream, destroyed after it
  Stream stream_;
  const int fd_;
  Deadline deadline_;
  const std::string peer_;
  boost::beast::flat_buffer buffer_;
  unsigned version_ = 11;  // the current request's HTTP version (10 or 11)
};

namespace {

template <class Stream>
awaitable<void> Run(std::unique_ptr<HttpConnection<Stream>> connection) {
  co_await connection->Serve();
}

void LogIfThrew(const std::exception_ptr& thrown) {
  if (thrown == nullptr) return;
  try {
    std::rethrow_exception(thrown);
  } catch (const std::exception& e) {
    Log(LogLevel::kError, "http_connection_failed", {{"error", e.what()}});
  } catch (...) {
    Log(LogLevel::kError, "http_connection_failed", {});
  }
}

}  // namespace

void HttpConnections::Serve(const HttpServer& server, tcp::socket socket, std::string peer) {
  // Each connection is made here, on the accepting thread, so the guard counts it (Opened)
  // before the next accept is admitted.
  const net::any_io_executor executor = socket.get_executor();
  if (server.options_.tls != nullptr) {
    using TlsStream = net::ssl::stream<tcp::socket>;
    std::shared_ptr<net::ssl::context> context = server.options_.tls->Context();
    auto connection = std::make_unique<HttpConnection<TlsStream>>(
        server, TlsStream(std::move(socket), *context), std::move(peer), context);
    net::co_spawn(executor, Run(std::move(connection)), &LogIfThrew);
  } else {
    auto connection =
        std::make_unique<HttpConnection<tcp::socket>>(server, std::move(socket), std::move(peer));
    net::co_spawn(executor, Run(std::move(connection)), &LogIfThrew);
  }
}

}  // namespace specula
