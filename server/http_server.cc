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

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/log.h"
#include "server/config.h"

namespace specula {
namespace {

// What one request has read so far, kept between libmicrohttpd's calls of the access handler.
struct PendingRequest {
  HttpRequest request;
  const HttpRoute* route = nullptr;
};

MHD_Result Send(MHD_Connection* connection, const HttpResponse& r) {
  MHD_Response* response = MHD_create_response_from_buffer(
      r.body.size(), const_cast<char*>(r.body.data()), MHD_RESPMEM_MUST_COPY);
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

// A handler's answer; an exception must not unwind through libmicrohttpd's C frames.
HttpResponse RunHandler(const HttpRoute& route, const HttpRequest& request) {
  try {
    return route.handler(request);
  } catch (const std::exception& e) {
    Log(LogLevel::kError, "http_handler_failed", {{"path", request.path}, {"error", e.what()}});
  } catch (...) {
    Log(LogLevel::kError, "http_handler_failed", {{"path", request.path}});
  }
  return Plain(500, "internal error\n");
}

// The declared body length; nullopt without (or with an unreadable) Content-Length.
std::optional<size_t> ContentLength(MHD_Connection* connection) {
  const char* value =
      MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  size_t length = 0;
  if (value == nullptr || !absl::SimpleAtoi(value, &length)) return std::nullopt;
  return length;
}

// The socket address for HOST:PORT (ParseHostPort-checked); names are resolved.
absl::StatusOr<sockaddr_storage> ResolveListenAddress(const std::string& host_port) {
  std::string host;
  int port = 0;
  if (absl::Status s = ParseHostPort(host_port, &host, &port); !s.ok()) return s;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int err = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); err != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve '", host, "': ", gai_strerror(err)));
  }
  sockaddr_storage addr{};
  std::memcpy(&addr, found->ai_addr, found->ai_addrlen);
  freeaddrinfo(found);
  return addr;
}

}  // namespace

// libmicrohttpd's C callbacks; a struct so HttpServer can befriend them.
struct HttpServerCallbacks {
  static MHD_Result Access(void* cls, MHD_Connection* connection, const char* url,
                           const char* method, const char* /*version*/, const char* upload_data,
                           size_t* upload_data_size, void** state) {
    const auto* server = static_cast<const HttpServer*>(cls);
    auto* pending = static_cast<PendingRequest*>(*state);
    if (pending == nullptr) {
      // First call: headers only. Unknown paths and methods are answered before any body is read.
      pending = new PendingRequest();
      *state = pending;
      pending->request.method = method;
      pending->request.path = url;
      HttpResponse refusal;
      pending->route = server->Match(pending->request, &refusal);
      if (pending->route == nullptr) return Send(connection, refusal);
      // A declared body over the limit is refused before any of it is read.
      if (ContentLength(connection).value_or(0) > server->options_.max_body_bytes) {
        return Send(connection, server->TooLarge());
      }
      return MHD_YES;
    }
    if (*upload_data_size > 0) {
      const size_t room = server->options_.max_body_bytes - pending->request.body.size();
      // A chunked body that grows past the limit: libmicrohttpd cannot answer in the middle of a
      // body, so the connection is closed.
      if (*upload_data_size > room) return MHD_NO;
      pending->request.body.append(upload_data, *upload_data_size);
      *upload_data_size = 0;
      return MHD_YES;
    }
    return Send(connection, RunHandler(*pending->route, pending->request));
  }

  static void Completed(void*, MHD_Connection*, void** state, MHD_RequestTerminationCode) {
    delete static_cast<PendingRequest*>(*state);
    *state = nullptr;
  }
};

const HttpRoute* HttpServer::Match(const HttpRequest& request, HttpResponse* refusal) const {
  const HttpRoute* route = nullptr;
  for (const HttpRoute& r : routes_) {
    if (r.path == request.path) route = &r;
  }
  if (route == nullptr) {
    *refusal = Plain(404, absl::StrCat("no such path: ", request.path, "\n"));
    return nullptr;
  }
  if (std::find(route->methods.begin(), route->methods.end(), request.method) ==
      route->methods.end()) {
    *refusal = Plain(
        405, absl::StrCat("method ", request.method, " is not allowed on ", request.path, "\n"));
    refusal->headers.emplace_back("Allow", absl::StrJoin(route->methods, ", "));
    return nullptr;
  }
  return route;
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& host_port,
                                                              std::vector<HttpRoute> routes,
                                                              const HttpServerOptions& options) {
  if (options.idle_timeout_seconds < 1 || options.max_connections < 1 || options.threads < 1) {
    return absl::InvalidArgumentError(
        "http server: idle_timeout_seconds, max_connections and threads must be >= 1");
  }
  absl::StatusOr<sockaddr_storage> addr = ResolveListenAddress(host_port);
  if (!addr.ok()) return addr.status();
  std::unique_ptr<HttpServer> server(new HttpServer(std::move(routes), options));
  unsigned int flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
  // "[::]" takes IPv4 too, as gRPC's listener does (libmicrohttpd would set IPV6_V6ONLY).
  if (addr->ss_family == AF_INET6) flags |= MHD_USE_DUAL_STACK;
  // The logger first, so complaints about the options below reach it too. One thread is the
  // internal polling thread itself; a pool is only asked for beyond that.
  server->daemon_ = MHD_start_daemon(
      flags, /*port=*/0, /*apc=*/nullptr, nullptr, &HttpServerCallbacks::Access, server.get(),
      MHD_OPTION_EXTERNAL_LOGGER, &LogMhdError, server.get(),     //
      MHD_OPTION_SOCK_ADDR, reinterpret_cast<sockaddr*>(&*addr),  //
      MHD_OPTION_CONNECTION_TIMEOUT, static_cast<unsigned>(options.idle_timeout_seconds),
      MHD_OPTION_CONNECTION_LIMIT, static_cast<unsigned>(options.max_connections),
      MHD_OPTION_NOTIFY_COMPLETED, &HttpServerCallbacks::Completed, nullptr,
      MHD_OPTION_THREAD_POOL_SIZE, static_cast<unsigned>(options.threads > 1 ? options.threads : 0),
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

HttpResponse HttpServer::TooLarge() const {
  return Plain(413, absl::StrCat("request body larger than ", options_.max_body_bytes, " bytes\n"));
}

void HttpServer::set_last_error(std::string message) {
  std::lock_guard lock(error_mu_);
  last_error_ = std::move(message);
}

std::string HttpServer::last_error() const {
  std::lock_guard lock(error_mu_);
  return last_error_;
}

HttpServer::~HttpServer() {
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

}  // namespace specula
