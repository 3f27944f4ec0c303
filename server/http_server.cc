#include "server/http_server.h"

#include <microhttpd.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <shared_mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/hex_digits.h"
#include "engine/common/log.h"
#include "server/config.h"
#include "server/connection_watcher.h"
#include "server/http_connection_guard.h"
#include "server/http_framing.h"
#include "server/http_tls.h"
#include "server/listen_address.h"

namespace specula {

// What exchanges share with their server, which they may outlive: whether its daemon still runs
// (a resume after MHD_stop_daemon would touch freed memory), and the lock that orders every
// resume before the stop.
struct DaemonGate {
  std::shared_mutex mu;
  bool stopped = false;  // guarded by mu
};

// One asynchronous exchange, shared by the HttpExchange handed to the route and libmicrohttpd's
// side (the access handler, the content reader, the completion callback).
struct HttpExchangeState {
  std::mutex mu;
  std::shared_ptr<DaemonGate> gate;
  bool closing = false;  // the server is stopping: never park again (stop panics on a parked one)
  MHD_Connection* connection = nullptr;  // null once libmicrohttpd is done with it
  ConnectionWatcher* watcher = nullptr;
  int fd = -1;
  unsigned stream_stall_seconds = 0;  // the connection's timeout while its answer streams
  bool parked = false;                // suspended in libmicrohttpd (and watched)
  uint64_t watch_id = 0;
  enum class Mode { kWaiting, kFull, kStream } mode = Mode::kWaiting;
  HttpResponse response;  // kFull: all of it; kStream: status and headers
  std::string pending;    // streamed bytes libmicrohttpd has not read yet
  bool ended = false;     // End() ran: the stream ends once `pending` is read
  bool gone = false;      // the client left before the answer was complete
  std::function<void()> on_gone;
};

namespace {

// How much of a chunked body past the limit is read (and dropped) to answer it with 413.
constexpr size_t kMaxDiscardedBodyBytes = 16 << 20;

// What one request has read so far, kept between libmicrohttpd's calls of the access handler.
struct PendingRequest {
  HttpRequest request;
  const HttpRoute* route = nullptr;
  int status = 0;        // of the answer queued by the access handler (an exchange keeps its own)
  size_t discarded = 0;  // bytes of a chunked body past the limit, read and dropped
  std::shared_ptr<HttpExchangeState> exchange;  // an asynchronous route's, once its handler ran
};

std::string AddressString(const sockaddr* addr) {
  if (addr == nullptr) return "";
  char host[NI_MAXHOST] = {};
  const socklen_t len = addr->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  if (getnameinfo(addr, len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0) return "";
  return host;
}

std::string PeerAddress(MHD_Connection* connection) {
  const MHD_ConnectionInfo* info =
      MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  return info == nullptr ? "" : AddressString(info->client_addr);
}

// With their lengths, so that a NUL inside a value would reach CheckRequestHead and be refused.
// (libmicrohttpd 0.9.75 itself ends a value at a NUL, so today the rest is dropped, not refused:
// docs/SERVING.md, "Request framing and the stack question".)
MHD_Result CollectHeader(void* cls, MHD_ValueKind, const char* key, size_t key_size,
                         const char* value, size_t value_size) {
  auto* headers = static_cast<std::vector<std::pair<std::string, std::string>>*>(cls);
  headers->emplace_back(absl::AsciiStrToLower(std::string(key, key_size)),
                        value == nullptr ? "" : std::string(value, value_size));
  return MHD_YES;
}

// The answer to a request whose head is refused: the connection closes after it, since where the
// next request would begin is unknown.
HttpResponse Closing(HttpResponse response) {
  response.headers.emplace_back(MHD_HTTP_HEADER_CONNECTION, "close");
  return response;
}

// Queues `response` (owned: released here) with the status and headers of `r`.
MHD_Result QueueWithHeaders(MHD_Connection* connection, MHD_Response* response,
                            const HttpResponse& r) {
  if (response == nullptr) return MHD_NO;
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, r.content_type.c_str());
  for (const auto& [name, value] : r.headers) {
    MHD_add_response_header(response, name.c_str(), value.c_str());
  }
  // libmicrohttpd leaves the body out of HEAD responses itself.
  const MHD_Result queued =
      MHD_queue_response(connection, static_cast<unsigned>(r.status), response);
  MHD_destroy_response(response);
  return queued;
}

MHD_Result Send(MHD_Connection* connection, const HttpResponse& r) {
  return QueueWithHeaders(
      connection,
      MHD_create_response_from_buffer(r.body.size(), const_cast<char*>(r.body.data()),
                                      MHD_RESPMEM_MUST_COPY),
      r);
}

// Send, remembering the status for HttpServerOptions::on_answered.
MHD_Result Answer(PendingRequest* pending, MHD_Connection* connection, const HttpResponse& r) {
  pending->status = r.status;
  return Send(connection, r);
}

// The status sent for `pending`: the access handler's answer, or its exchange's (0: none yet).
int AnsweredStatus(const PendingRequest& pending) {
  if (pending.exchange == nullptr) return pending.status;
  std::lock_guard lock(pending.exchange->mu);
  return pending.exchange->mode == HttpExchangeState::Mode::kWaiting
             ? 0
             : pending.exchange->response.status;
}

// The route label of on_answered.
std::string RouteLabel(const HttpRoute* route) {
  if (route == nullptr) return "none";
  return route->with_id ? route->path + "{id}" : route->path;
}

HttpResponse Plain(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

// libmicrohttpd's error lines, to the log at debug level (a client's broken request is not the
// operator's problem); `cls` is the HttpServer, which keeps the last one for its startup error.
void LogMhdError(void* cls, const char* format, va_list args) {
  char buf[512];
  std::vsnprintf(buf, sizeof(buf), format, args);
  std::string message(buf);
  while (!message.empty() && message.back() == '\n') message.pop_back();
  Log(LogLevel::kDebug, "http_error", {{"error", message}});
  static_cast<HttpServer*>(cls)->set_last_error(std::move(message));
}

// Runs a handler; an exception must not unwind through libmicrohttpd's C frames. False (logged)
// when it threw: the caller answers 500.
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

// The declared body length; nullopt without (or with an unreadable) Content-Length.
std::optional<size_t> ContentLength(MHD_Connection* connection) {
  const char* value =
      MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  size_t length = 0;
  if (value == nullptr || !absl::SimpleAtoi(value, &length)) return std::nullopt;
  return length;
}

void OnHangUp(const std::weak_ptr<HttpExchangeState>& weak);

// Suspends the connection until the answer (or its next piece) is there, and watches its socket
// for a hang-up meanwhile. Called on the polling thread, with `s.mu` held.
void Park(const std::shared_ptr<HttpExchangeState>& state) {
  HttpExchangeState& s = *state;
  s.parked = true;
  MHD_suspend_connection(s.connection);
  if (s.watcher != nullptr && s.fd >= 0) {
    s.watch_id = s.watcher->Watch(s.fd, [weak = std::weak_ptr(state)] { OnHangUp(weak); });
  }
}

// Resumes a parked connection. Takes the parking under `lock` (so one caller resumes it), then
// unwatches and resumes outside it: the watcher's callback takes `s.mu` itself. A suspended
// connection is never closed by libmicrohttpd, so `connection` stays valid until the resume.
void Unpark(HttpExchangeState& s, std::unique_lock<std::mutex>& lock) {
  if (!s.parked) return;
  s.parked = false;
  MHD_Connection* connection = s.connection;
  const uint64_t watch_id = s.watch_id;
  s.watch_id = 0;
  lock.unlock();
  std::shared_lock gate(s.gate->mu);
  if (s.gate->stopped) return;
  if (s.watcher != nullptr) s.watcher->Unwatch(watch_id);
  MHD_resume_connection(connection);
}

// The client left while the connection was parked: the route hears it (and cancels its work);
// the connection is resumed by the answer that follows.
void OnHangUp(const std::weak_ptr<HttpExchangeState>& weak) {
  std::shared_ptr<HttpExchangeState> state = weak.lock();
  if (state == nullptr) return;
  std::function<void()> on_gone;
  {
    std::lock_guard lock(state->mu);
    state->watch_id = 0;
    if (state->gone || state->connection == nullptr) return;
    state->gone = true;
    on_gone = std::move(state->on_gone);
  }
  if (on_gone) on_gone();
}

// libmicrohttpd reads the streamed body from here. Nothing pending: park until the next Write.
ssize_t ReadStream(void* cls, uint64_t /*pos*/, char* buf, size_t max) {
  const auto& state = *static_cast<std::shared_ptr<HttpExchangeState>*>(cls);
  std::lock_guard lock(state->mu);
  if (!state->pending.empty()) {
    const size_t n = std::min(max, state->pending.size());
    std::memcpy(buf, state->pending.data(), n);
    state->pending.erase(0, n);
    return static_cast<ssize_t>(n);
  }
  if (state->ended) return MHD_CONTENT_READER_END_OF_STREAM;
  if (state->gone || state->closing) return MHD_CONTENT_READER_END_WITH_ERROR;
  Park(state);
  return 0;
}

void FreeStreamState(void* cls) { delete static_cast<std::shared_ptr<HttpExchangeState>*>(cls); }

// While the answer streams, a client that pauses reading is not idle: the connection's timeout
// becomes the stall bound (the completion callback puts the idle timeout back).
MHD_Result QueueStream(MHD_Connection* connection,
                       const std::shared_ptr<HttpExchangeState>& state) {
  MHD_set_connection_option(connection, MHD_CONNECTION_OPTION_TIMEOUT, state->stream_stall_seconds);
  return QueueWithHeaders(connection,
                          MHD_create_response_from_callback(
                              MHD_SIZE_UNKNOWN, 16 * 1024, &ReadStream,
                              new std::shared_ptr<HttpExchangeState>(state), &FreeStreamState),
                          state->response);
}

// The access handler's answer for an asynchronous route: the response if the route gave one,
// else the connection parks until it does.
// libmicrohttpd is called without the exchange's lock: it calls ReadStream (which takes that
// lock) holding its response's lock, so holding ours while calling it would be the reverse order
// (ThreadSanitizer's lock-order check). Once the mode is no longer kWaiting nothing writes the
// response again, so it is read unlocked.
MHD_Result QueueOrPark(MHD_Connection* connection,
                       const std::shared_ptr<HttpExchangeState>& state) {
  HttpExchangeState::Mode mode;
  {
    std::lock_guard lock(state->mu);
    mode = state->mode;
    if (mode == HttpExchangeState::Mode::kWaiting) {
      if (state->closing) return MHD_NO;  // the server is stopping: close the connection
      Park(state);
      return MHD_YES;
    }
  }
  return mode == HttpExchangeState::Mode::kFull ? Send(connection, state->response)
                                                : QueueStream(connection, state);
}

}  // namespace

void HttpExchange::Respond(HttpResponse response) {
  std::unique_lock lock(state_->mu);
  if (state_->mode != HttpExchangeState::Mode::kWaiting || state_->connection == nullptr) return;
  state_->mode = HttpExchangeState::Mode::kFull;
  state_->response = std::move(response);
  Unpark(*state_, lock);
}

void HttpExchange::StartStream(int status, std::string content_type,
                               std::vector<std::pair<std::string, std::string>> headers) {
  std::unique_lock lock(state_->mu);
  if (state_->mode != HttpExchangeState::Mode::kWaiting || state_->connection == nullptr) return;
  state_->mode = HttpExchangeState::Mode::kStream;
  state_->response.status = status;
  state_->response.content_type = std::move(content_type);
  state_->response.headers = std::move(headers);
  Unpark(*state_, lock);
}

void HttpExchange::Write(std::string_view data) {
  std::unique_lock lock(state_->mu);
  if (state_->mode != HttpExchangeState::Mode::kStream || state_->ended || state_->gone ||
      state_->connection == nullptr) {
    return;
  }
  state_->pending.append(data);
  Unpark(*state_, lock);
}

void HttpExchange::End() {
  std::unique_lock lock(state_->mu);
  if (state_->mode != HttpExchangeState::Mode::kStream || state_->ended ||
      state_->connection == nullptr) {
    return;
  }
  state_->ended = true;
  Unpark(*state_, lock);
}

void HttpExchange::OnClientGone(std::function<void()> on_gone) {
  {
    std::lock_guard lock(state_->mu);
    if (!state_->gone) {
      state_->on_gone = std::move(on_gone);
      return;
    }
  }
  on_gone();
}

const std::string* HttpRequest::header(std::string_view lower_case_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lower_case_name) return &value;
  }
  return nullptr;
}

// libmicrohttpd's C callbacks; a struct so HttpServer can befriend them.
struct HttpServerCallbacks {
  static MHD_Result Access(void* cls, MHD_Connection* connection, const char* url,
                           const char* method, const char* version, const char* upload_data,
                           size_t* upload_data_size, void** state) {
    const auto* server = static_cast<const HttpServer*>(cls);
    auto* pending = static_cast<PendingRequest*>(*state);
    // Called again after a resume, before the answer was queued.
    if (pending != nullptr && pending->exchange != nullptr) {
      return QueueOrPark(connection, pending->exchange);
    }
    if (pending == nullptr) {
      // First call: headers only. Unknown paths and methods are answered before any body is read.
      pending = new PendingRequest();
      *state = pending;
      pending->request.method = method;
      pending->request.path = url;
      pending->request.peer = PeerAddress(connection);
      MHD_get_connection_values_n(connection, MHD_HEADER_KIND, &CollectHeader,
                                  &pending->request.headers);
      if (auto refusal = CheckRequestHead(version, pending->request.headers)) {
        server->ReportRefused("malformed");
        return Answer(pending, connection,
                      Closing(server->Refusal(refusal->status, refusal->reason)));
      }
      if (absl::Status s = server->CheckClientCertificate(connection); !s.ok()) {
        return Answer(pending, connection, server->Refusal(403, std::string(s.message())));
      }
      if (auto refusal = server->Authenticate(pending->request)) {
        server->ReportRefused("unauthenticated");
        return Answer(pending, connection, *refusal);
      }
      HttpResponse refusal;
      pending->route = server->Match(pending->request, &refusal);
      if (pending->route == nullptr) return Answer(pending, connection, refusal);
      // A declared body over the limit is refused before any of it is read.
      if (ContentLength(connection).value_or(0) > server->options_.max_body_bytes) {
        server->ReportRefused("body_too_large");
        return Answer(pending, connection, server->TooLarge());
      }
      return MHD_YES;
    }
    if (*upload_data_size > 0) return ReadBody(server, pending, upload_data, upload_data_size);
    server->guard_->RequestRead(connection);  // the whole request is in: no deadline now
    // A chunked body that outgrew the limit was read to its end: now the 413 can be sent.
    if (pending->discarded > 0) {
      server->ReportRefused("body_too_large");
      return Answer(pending, connection, Closing(server->TooLarge()));
    }
    if (pending->route->async_handler) return StartAsync(server, connection, pending);
    HttpResponse response;
    if (!RunGuarded(pending->request,
                    [&] { response = pending->route->handler(pending->request); })) {
      response = server->Refusal(500, "internal error");
    }
    return Answer(pending, connection, response);
  }

  // A chunked body that grows past the limit cannot be answered mid-body (libmicrohttpd queues a
  // response only once the body is read), so the rest is read and dropped and the 413 follows;
  // past kMaxDiscardedBodyBytes more the connection is closed without one.
  static MHD_Result ReadBody(const HttpServer* server, PendingRequest* pending, const char* data,
                             size_t* size) {
    const size_t room = server->options_.max_body_bytes - pending->request.body.size();
    if (pending->discarded > 0 || *size > room) {
      pending->discarded += *size;
      *size = 0;
      return pending->discarded <= kMaxDiscardedBodyBytes ? MHD_YES : MHD_NO;
    }
    pending->request.body.append(data, *size);
    *size = 0;
    return MHD_YES;
  }

  // A request line arrived (libmicrohttpd's URI log hook): the guard's read deadline runs. The
  // returned pointer would become the request's state, which Access expects to start null.
  static void* RequestStarted(void* cls, const char* /*uri*/, MHD_Connection* connection) {
    static_cast<const HttpServer*>(cls)->guard_->RequestStarted(connection);
    return nullptr;
  }

  // Whether a new connection may be accepted (the guard's limits; called before it is set up).
  static MHD_Result AcceptPolicy(void* cls, const sockaddr* addr, socklen_t /*len*/) {
    const auto* server = static_cast<const HttpServer*>(cls);
    return server->guard_->Admit(AddressString(addr)) ? MHD_YES : MHD_NO;
  }

  // A connection starts (the guard starts its read deadline; its TLS session learns which
  // certificate to present) or ends (before its socket is closed).
  static void ConnectionNotice(void* cls, MHD_Connection* connection, void** /*socket_context*/,
                               MHD_ConnectionNotificationCode code) {
    const auto* server = static_cast<const HttpServer*>(cls);
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
      server->guard_->Closed(connection);
      return;
    }
    const MHD_ConnectionInfo* fd =
        MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (fd != nullptr) server->guard_->Opened(connection, fd->connect_fd, PeerAddress(connection));
    if (server->options_.tls == nullptr) return;
    const MHD_ConnectionInfo* info =
        MHD_get_connection_info(connection, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    if (info != nullptr && info->tls_session != nullptr) {
      server->options_.tls->Attach(static_cast<gnutls_session_t>(info->tls_session));
    }
  }

  static MHD_Result StartAsync(const HttpServer* server, MHD_Connection* connection,
                               PendingRequest* pending) {
    auto state = std::make_shared<HttpExchangeState>();
    state->connection = connection;
    state->watcher = server->watcher_.get();
    state->gate = server->gate_;
    server->Register(state);
    const MHD_ConnectionInfo* info =
        MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    state->fd = info == nullptr ? -1 : info->connect_fd;
    state->stream_stall_seconds = static_cast<unsigned>(server->options_.stream_stall_seconds);
    pending->exchange = state;
    auto exchange = std::make_shared<HttpExchange>(state);
    if (!RunGuarded(pending->request,
                    [&] { pending->route->async_handler(pending->request, exchange); })) {
      exchange->Respond(server->Refusal(500, "internal error"));
    }
    return QueueOrPark(connection, state);
  }

  static void Completed(void* cls, MHD_Connection* connection, void** state,
                        MHD_RequestTerminationCode code) {
    static_cast<const HttpServer*>(cls)->guard_->ResponseDone(connection);
    auto* pending = static_cast<PendingRequest*>(*state);
    *state = nullptr;
    if (pending != nullptr) {
      static_cast<const HttpServer*>(cls)->ReportAnswered(RouteLabel(pending->route),
                                                          AnsweredStatus(*pending));
    }
    if (pending != nullptr && pending->exchange != nullptr) {
      if (code == MHD_REQUEST_TERMINATED_COMPLETED_OK) {  // kept alive: idle rules again
        const auto idle = static_cast<unsigned>(
            static_cast<const HttpServer*>(cls)->options_.idle_timeout_seconds);
        MHD_set_connection_option(connection, MHD_CONNECTION_OPTION_TIMEOUT, idle);
      }
      Finished(*pending->exchange, code);
    }
    delete pending;
  }

  // libmicrohttpd is done with an exchange's connection: later answers go nowhere, and a client
  // that left before the answer was complete is reported to the route.
  static void Finished(HttpExchangeState& s, MHD_RequestTerminationCode code) {
    std::function<void()> on_gone;
    uint64_t watch_id;
    {
      std::lock_guard lock(s.mu);
      s.connection = nullptr;
      watch_id = s.watch_id;
      s.watch_id = 0;
      if (code != MHD_REQUEST_TERMINATED_COMPLETED_OK && !s.gone) {
        s.gone = true;
        on_gone = std::move(s.on_gone);
      }
    }
    if (s.watcher != nullptr) s.watcher->Unwatch(watch_id);
    if (on_gone) on_gone();
  }
};

std::optional<HttpResponse> HttpServer::Authenticate(const HttpRequest& request) const {
  const std::vector<std::string>& open = options_.open_paths;
  if (!options_.authenticate || std::find(open.begin(), open.end(), request.path) != open.end()) {
    return std::nullopt;
  }
  return options_.authenticate(request);
}

const HttpRoute* HttpServer::Match(const HttpRequest& request, HttpResponse* refusal) const {
  const HttpRoute* route = nullptr;
  for (const HttpRoute& r : routes_) {
    if (!r.with_id && r.path == request.path) route = &r;
  }
  for (const HttpRoute& r : routes_) {
    if (route != nullptr) break;
    if (!r.with_id || !absl::StartsWith(request.path, r.path)) continue;
    const std::string_view id = std::string_view(request.path).substr(r.path.size());
    if (!id.empty() && id.find('/') == std::string_view::npos) route = &r;
  }
  if (route == nullptr) {
    *refusal = Refusal(404, absl::StrCat("no such path: ", request.path));
    return nullptr;
  }
  // HEAD is GET without the body (libmicrohttpd leaves it out).
  const std::string_view method =
      request.method == "HEAD" ? std::string_view("GET") : std::string_view(request.method);
  if (std::find(route->methods.begin(), route->methods.end(), method) == route->methods.end()) {
    *refusal =
        Refusal(405, absl::StrCat("method ", request.method, " is not allowed on ", request.path));
    refusal->headers.emplace_back("Allow", absl::StrJoin(route->methods, ", "));
    return nullptr;
  }
  return route;
}

namespace {

// libmicrohttpd's own unescaping turns %00 into a NUL, which ends the C string routes are matched
// on: "/v1/models/<id>%00junk" answered as "/v1/models/<id>". This decodes the same escapes in
// place, except that %00 stays as written (no route has it, so it is a 404).
size_t UnescapeKeepingNul(void* /*cls*/, MHD_Connection* /*connection*/, char* s) {
  char* out = s;
  for (const char* in = s; *in != '\0';) {
    if (in[0] == '%' && HexDigitValue(in[1]) >= 0 && HexDigitValue(in[2]) >= 0) {
      const int byte = HexDigitValue(in[1]) * 16 + HexDigitValue(in[2]);
      if (byte != 0) {
        *out++ = static_cast<char>(byte);
        in += 3;
        continue;
      }
    }
    *out++ = *in++;
  }
  *out = '\0';
  return static_cast<size_t>(out - s);
}

// libmicrohttpd's own limit, above the guard's: the guard decides (and makes room at its limit),
// while connections it shut down are still closing, and although libmicrohttpd splits its limit
// evenly between the polling threads, which do not get equal shares of the connections.
// The TLS options of the daemon (with MHD_OPTION_END; only that without server.tls), and the
// TLS flag in `flags`.
absl::StatusOr<std::vector<MHD_OptionItem>> TlsOptions(const HttpServerOptions& options,
                                                       unsigned int* flags) {
  std::vector<MHD_OptionItem> items;
  if (options.tls != nullptr) {
    if (MHD_is_feature_supported(MHD_FEATURE_HTTPS_CERT_CALLBACK) != MHD_YES) {
      return absl::FailedPreconditionError(
          "server.tls: this libmicrohttpd was built without HTTPS support");
    }
    *flags |= MHD_USE_TLS;
    items.push_back({MHD_OPTION_HTTPS_CERT_CALLBACK, 0,
                     reinterpret_cast<void*>(&HttpTls::RetrieveCertificate)});
    // Makes libmicrohttpd ask clients for a certificate; HttpTls verifies it per request.
    if (options.tls->requires_client_certificate()) {
      items.push_back({MHD_OPTION_HTTPS_MEM_TRUST, 0,
                       const_cast<char*>(options.tls->initial_client_ca_pem().c_str())});
    }
  }
  items.push_back({MHD_OPTION_END, 0, nullptr});
  return items;
}

unsigned HardConnectionLimit(const HttpServerOptions& options) {
  return static_cast<unsigned>(options.max_connections) * 2 + 64;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& host_port,
                                                              std::vector<HttpRoute> routes,
                                                              const HttpServerOptions& options) {
  if (options.idle_timeout_seconds < 1 || options.max_connections < 1 || options.threads < 1 ||
      !(options.request_read_seconds > 0) || options.max_connections_per_ip < 0 ||
      options.stream_stall_seconds < 0) {
    return absl::InvalidArgumentError(
        "http server: idle_timeout_seconds, max_connections and threads must be >= 1, "
        "request_read_seconds > 0, max_connections_per_ip and stream_stall_seconds >= 0");
  }
  absl::StatusOr<sockaddr_storage> addr = ResolveListenAddress(host_port);
  if (!addr.ok()) return addr.status();
  std::unique_ptr<HttpServer> server(new HttpServer(std::move(routes), options));
  absl::StatusOr<std::unique_ptr<ConnectionWatcher>> watcher = ConnectionWatcher::Start();
  if (!watcher.ok()) return watcher.status();
  server->watcher_ = *std::move(watcher);
  server->StartGuard();
  unsigned int flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME;
  // "[::]" takes IPv4 too, as gRPC's listener does (libmicrohttpd would set IPV6_V6ONLY).
  if (addr->ss_family == AF_INET6) flags |= MHD_USE_DUAL_STACK;
  absl::StatusOr<std::vector<MHD_OptionItem>> tls_options = TlsOptions(options, &flags);
  if (!tls_options.ok()) return tls_options.status();
  // The logger first, so complaints about the options below reach it too. One thread is the
  // internal polling thread itself; a pool is only asked for beyond that.
  server->daemon_ = MHD_start_daemon(
      flags, /*port=*/0, &HttpServerCallbacks::AcceptPolicy, server.get(),
      &HttpServerCallbacks::Access, server.get(), MHD_OPTION_EXTERNAL_LOGGER, &LogMhdError,
      server.get(),                                               //
      MHD_OPTION_SOCK_ADDR, reinterpret_cast<sockaddr*>(&*addr),  //
      MHD_OPTION_CONNECTION_TIMEOUT, static_cast<unsigned>(options.idle_timeout_seconds),
      MHD_OPTION_CONNECTION_LIMIT, HardConnectionLimit(options), MHD_OPTION_NOTIFY_COMPLETED,
      &HttpServerCallbacks::Completed, server.get(), MHD_OPTION_NOTIFY_CONNECTION,
      &HttpServerCallbacks::ConnectionNotice, server.get(), MHD_OPTION_URI_LOG_CALLBACK,
      &HttpServerCallbacks::RequestStarted, server.get(), MHD_OPTION_UNESCAPE_CALLBACK,
      &UnescapeKeepingNul, nullptr,  //
      MHD_OPTION_THREAD_POOL_SIZE, static_cast<unsigned>(options.threads > 1 ? options.threads : 0),
      MHD_OPTION_ARRAY, tls_options->data(),  //
      MHD_OPTION_END);
  if (server->daemon_ == nullptr) {
    const std::string why = server->last_error();
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on '", host_port,
        "': ", why.empty() ? "is the address in use, or not one of this machine?" : why));
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(server->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  server->port_ = info == nullptr ? 0 : info->port;
  return server;
}

HttpServer::HttpServer(std::vector<HttpRoute> routes, const HttpServerOptions& options)
    : routes_(std::move(routes)), options_(options), gate_(std::make_shared<DaemonGate>()) {}

void HttpServer::StartGuard() {
  HttpConnectionGuardOptions guard;
  guard.read_timeout = absl::Seconds(options_.request_read_seconds);
  guard.max_connections = options_.max_connections;
  guard.max_per_peer = options_.max_connections_per_ip;
  guard.on_refused = [this](absl::string_view reason) {
    ReportRefused(std::string_view(reason.data(), reason.size()));
  };
  guard_ = std::make_unique<HttpConnectionGuard>(std::move(guard));
  guard_->StartSweeper();
}

absl::Status HttpServer::CheckClientCertificate(MHD_Connection* connection) const {
  if (options_.tls == nullptr || !options_.tls->requires_client_certificate()) {
    return absl::OkStatus();
  }
  const MHD_ConnectionInfo* info =
      MHD_get_connection_info(connection, MHD_CONNECTION_INFO_GNUTLS_SESSION);
  return options_.tls->CheckClient(
      info == nullptr ? nullptr : static_cast<gnutls_session_t>(info->tls_session));
}

void HttpServer::ReportAnswered(std::string_view route, int status) const {
  if (options_.on_answered) options_.on_answered(route, status);
}

void HttpServer::ReportRefused(std::string_view reason) const {
  if (options_.on_refused) options_.on_refused(reason);
}

HttpResponse HttpServer::TooLarge() const {
  return Refusal(413, absl::StrCat("request body larger than ", options_.max_body_bytes, " bytes"));
}

HttpResponse HttpServer::Refusal(int status, const std::string& message) const {
  if (options_.error_response) return options_.error_response(status, message);
  return Plain(status, message + "\n");
}

void HttpServer::set_last_error(std::string message) {
  std::lock_guard lock(error_mu_);
  last_error_ = std::move(message);
}

std::string HttpServer::last_error() const {
  std::lock_guard lock(error_mu_);
  return last_error_;
}

void HttpServer::Register(const std::shared_ptr<HttpExchangeState>& state) const {
  std::lock_guard lock(live_mu_);
  std::erase_if(live_, [](const std::weak_ptr<HttpExchangeState>& w) { return w.expired(); });
  if (closing_) {
    std::lock_guard state_lock(state->mu);
    state->closing = true;
  }
  live_.push_back(state);
}

HttpServer::~HttpServer() {
  if (daemon_ == nullptr) return;
  // libmicrohttpd panics when stopped with a suspended connection: every exchange stops parking
  // and the parked ones are resumed, to be closed by the stop.
  std::vector<std::shared_ptr<HttpExchangeState>> live;
  {
    std::lock_guard lock(live_mu_);
    closing_ = true;
    for (const std::weak_ptr<HttpExchangeState>& w : live_) {
      if (auto s = w.lock()) live.push_back(std::move(s));
    }
  }
  for (const std::shared_ptr<HttpExchangeState>& s : live) {
    std::unique_lock lock(s->mu);
    s->closing = true;
    Unpark(*s, lock);
  }
  // Resumes running on other threads finish first; later ones see `stopped` and do nothing.
  std::unique_lock gate(gate_->mu);
  MHD_stop_daemon(daemon_);
  gate_->stopped = true;
}

}  // namespace specula
