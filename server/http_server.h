// specula's one HTTP stack: a small router over Boost.Beast's HTTP/1.1 parser and Asio. It serves
// the OpenAI-compatible API and /metrics.
//
// Why this stack (docs/SERVING.md, "HTTP"): it is event-driven (epoll), so an idle or slowly
// dripping connection costs a descriptor and a coroutine frame, not a worker thread (thread-per-
// connection servers let a handful of such connections block every other request); Beast's
// parser refuses ambiguous framing (Content-Length with Transfer-Encoding, conflicting or
// malformed lengths, control characters in fields) by construction and never writes, so every
// response on the wire is built by this listener (server/http_wire.h): a route's answer, 404 for
// an unknown path, 405 (with Allow) for a method the route does not take, and the refusals of
// malformed, unauthenticated or oversized requests.
//
// Threading: handlers run on the server's threads; they must be quick and must not block (they
// build a response from in-memory state). Work that takes time (a generation) uses an
// asynchronous route: its handler starts the work and returns; the answer comes later, from any
// thread, through the HttpExchange, while the connection waits (costing no thread, its socket
// watched for a hang-up by a ConnectionWatcher). Streamed answers use chunked transfer encoding;
// what the route writes while a write is in flight goes out coalesced in the next one.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace specula {

struct HttpRequest {
  std::string method;  // as sent, e.g. "GET"
  std::string path;    // the URL's path, without the query string
  std::string body;    // at most HttpServerOptions::max_body_bytes
  std::string peer;    // the client's IP address ("10.0.0.1", "::1"); "" when unknown
  // Request headers, names lower-cased, in arrival order.
  std::vector<std::pair<std::string, std::string>> headers;

  // The first header named `lower_case_name`, or null.
  const std::string* header(std::string_view lower_case_name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

class ConnectionWatcher;
class HttpConnectionGuard;
class HttpTls;
struct HttpExchangeState;

// The answer side of one request on an asynchronous route; any thread. Either Respond once, or
// StartStream, Write any number of times and End. The connection stays open (costing no thread)
// until then. Calls after the client went away, or after the server stopped, are ignored.
struct ServerGate;
class HttpExchange {
 public:
  explicit HttpExchange(std::shared_ptr<HttpExchangeState> state) : state_(std::move(state)) {}

  void Respond(HttpResponse response);
  // Sends the status and headers; the body follows in chunks.
  void StartStream(int status, std::string content_type,
                   std::vector<std::pair<std::string, std::string>> headers = {});
  void Write(std::string_view data);
  void End();
  // Runs `on_gone` once if the client hangs up (or the connection fails, or the server stops)
  // before the answer was complete; at once if that already happened. On a watcher or server
  // thread: must not block.
  void OnClientGone(std::function<void()> on_gone);

 private:
  std::shared_ptr<HttpExchangeState> state_;
};

using HttpAsyncHandler = std::function<void(const HttpRequest&, std::shared_ptr<HttpExchange>)>;

struct HttpRoute {
  std::string path;                          // matched exactly, or (with_id) as a prefix
  std::vector<std::string> methods;          // e.g. {"GET", "HEAD"}; HEAD answers without the body
  HttpHandler handler;                       // answers at once; or
  HttpAsyncHandler async_handler = nullptr;  // answers later through the exchange
  // The path ends with '/' and is followed by one non-empty segment, the id of what the route
  // serves ("/v1/responses/" matches "/v1/responses/resp_1", not ".../resp_1/x"). A route
  // matched exactly wins.
  bool with_id = false;
};

struct HttpServerOptions {
  // A connection with no traffic for this long is closed (idle keep-alive or a stalled request).
  int idle_timeout_seconds = 10;
  // A streamed answer (SSE) whose client reads nothing for this long is closed; until then its
  // output waits in the server (a pause longer than idle_timeout_seconds is not an idle
  // connection: the server has something to say). 0 = never.
  int stream_stall_seconds = 300;
  // Connections held at once. At the limit a new connection is admitted by closing an idle
  // keep-alive connection or else the one reading its request longest; with every connection's
  // request being answered, it is refused.
  int max_connections = 1024;
  // A connection must deliver each whole request (line, headers and body; on HTTPS the TLS
  // handshake before the first) within this long of opening or of its request line's arrival,
  // however slowly it trickles bytes (slowloris).
  double request_read_seconds = 10;
  // Connections from one client address at once; 0 = no limit (behind a load balancer or a
  // Kubernetes Service many clients can share one address).
  int max_connections_per_ip = 0;
  // Told of each refused or closed connection and refused request, by reason: per_ip_limit,
  // connection_limit, read_timeout, evicted (connections); malformed, body_too_large,
  // unauthenticated (requests). Any thread; must not block.
  std::function<void(std::string_view reason)> on_refused;
  // Told of each request answered, when its exchange ends: the route's template (its path, with
  // "{id}" after a route with an id; "none" for a request refused before routing or that no route
  // takes: an unknown path or method)
  // and the status sent (0 when the client left before any was). Any thread; must not block.
  std::function<void(std::string_view route, int status)> on_answered;
  // Threads running the connections (and the handlers).
  int threads = 1;
  // Largest request body read: a larger declared Content-Length gets 413 before the body is read
  // (and the connection closes); a chunked body that grows past it is read on and dropped, then
  // gets 413 and the connection closes (past 16 MiB more, it closes without an answer).
  size_t max_body_bytes = 64 * 1024;
  // Checked on every request's head before routing, except for `open_paths`: a refusal is sent
  // as it is, so without credentials unknown paths and methods cannot be told from known ones,
  // and no body is read (the connection closes after the refusal when one was declared). Unset:
  // no check.
  std::function<std::optional<HttpResponse>(const HttpRequest&)> authenticate;
  std::vector<std::string> open_paths;
  // The body of the server's own refusals (404, 405, 413); plain text when unset. The OpenAI
  // listener answers in OpenAI's JSON error format.
  std::function<HttpResponse(int status, const std::string& message)> error_response;
  // HTTPS with this certificate (and client CA, if it has one); null = plaintext HTTP.
  std::shared_ptr<HttpTls> tls;
};

class HttpServer {
 public:
  // Listens on "HOST:PORT" (port 0 picks a free one; IPv6 hosts in brackets). INVALID_ARGUMENT
  // for a malformed address or options, UNAVAILABLE naming the address when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& host_port,
                                                           std::vector<HttpRoute> routes,
                                                           const HttpServerOptions& options = {});
  // Stops listening and closes every connection.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }

 private:
  struct Listener;  // the event loop, the acceptor and the threads (http_server.cc)

  HttpServer(std::vector<HttpRoute> routes, const HttpServerOptions& options);
  // The connection guard (read deadlines, connection caps) and its sweeper.
  void StartGuard();

  // The route that serves `request`, or null with `refusal` set to a 404 (unknown path) or a 405
  // naming the allowed methods.
  const HttpRoute* Match(const HttpRequest& request, HttpResponse* refusal) const;
  // options_.authenticate's refusal of `request`, unless its path is open.
  std::optional<HttpResponse> Authenticate(const HttpRequest& request) const;
  // options_.on_refused, if set.
  void ReportRefused(std::string_view reason) const;
  // options_.on_answered, if set, for a request whose exchange ended.
  void ReportAnswered(std::string_view route, int status) const;
  // The 413 for a body over options_.max_body_bytes; the connection closes after it.
  HttpResponse TooLarge() const;
  // One of the server's own refusals, in options_.error_response's format.
  HttpResponse Refusal(int status, const std::string& message) const;

  // Keeps `state` to be finished by the destructor (its connection will never answer it).
  void Register(const std::shared_ptr<HttpExchangeState>& state) const;

  std::vector<HttpRoute> routes_;
  HttpServerOptions options_;
  std::shared_ptr<ServerGate> gate_;  // made in the constructor
  mutable std::mutex live_mu_;
  mutable std::vector<std::weak_ptr<HttpExchangeState>> live_;  // guarded by live_mu_
  std::unique_ptr<ConnectionWatcher> watcher_;  // outlives the connections (declared first)
  std::unique_ptr<HttpConnectionGuard> guard_;  // likewise
  std::unique_ptr<Listener> listener_;
  int port_ = 0;

  template <class Stream>
  friend class HttpConnection;
  friend class HttpConnections;
};

}  // namespace specula
