#include "server/http_server.h"

// Boost 1.74's Asio uses std::exchange without including <utility>.
#include <utility>
// clang-format off
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/ip/v6_only.hpp>
// clang-format on

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/log.h"
#include "server/connection_watcher.h"
#include "server/http_connection.h"
#include "server/http_connection_guard.h"
#include "server/http_exchange_state.h"
#include "server/http_wire.h"
#include "server/listen_address.h"

namespace specula {

namespace net = boost::asio;
using boost::system::error_code;
using net::ip::tcp;

struct HttpServer::Listener {
  net::io_context io;
  tcp::acceptor acceptor{io};
  std::vector<std::thread> threads;
};

void WakeConnection(HttpExchangeState& state) {
  std::shared_lock gate(state.gate->mu);
  if (state.gate->stopped) return;
  // Copied, called and destroyed under the gate: the copy holds the connection's timer, which
  // must not outlive the event loop.
  std::function<void()> wake;
  {
    std::lock_guard lock(state.mu);
    wake = state.wake;
  }
  if (wake) wake();
}

void WatchForHangUp(const std::shared_ptr<HttpExchangeState>& state, int fd) {
  const uint64_t id = state->watcher->Watch(
      fd, [weak = std::weak_ptr<HttpExchangeState>(state)] { ClientHungUp(weak); });
  std::lock_guard lock(state->mu);
  state->watch_id = id;
}

void StopWatchingForHangUp(HttpExchangeState& state) {
  uint64_t id;
  {
    std::lock_guard lock(state.mu);
    id = std::exchange(state.watch_id, 0);
  }
  // Outside the lock: a hang-up callback running now takes it, and Unwatch waits for it.
  if (id != 0) state.watcher->Unwatch(id);
}

void ClientHungUp(const std::weak_ptr<HttpExchangeState>& weak) {
  std::shared_ptr<HttpExchangeState> state = weak.lock();
  if (state == nullptr) return;
  std::function<void()> on_gone;
  {
    std::lock_guard lock(state->mu);
    state->watch_id = 0;
    if (state->gone || state->finished) return;
    state->gone = true;
    on_gone = std::move(state->on_gone);
  }
  if (on_gone) on_gone();
  WakeConnection(*state);
}

void FinishExchange(HttpExchangeState& state, bool completed) {
  StopWatchingForHangUp(state);
  std::function<void()> on_gone;
  std::function<void()> wake;  // destroyed here, while the event loop exists
  {
    std::lock_guard lock(state.mu);
    wake = std::move(state.wake);
    state.wake = nullptr;
    if (state.finished) return;
    state.finished = true;
    if (!completed && !state.gone) {
      state.gone = true;
      on_gone = std::move(state.on_gone);
    }
  }
  if (on_gone) on_gone();
}

void HttpExchange::Respond(HttpResponse response) {
  {
    std::lock_guard lock(state_->mu);
    if (state_->mode != HttpExchangeState::Mode::kWaiting || state_->finished) return;
    state_->mode = HttpExchangeState::Mode::kFull;
    state_->response = std::move(response);
  }
  WakeConnection(*state_);
}

void HttpExchange::StartStream(int status, std::string content_type,
                               std::vector<std::pair<std::string, std::string>> headers) {
  {
    std::lock_guard lock(state_->mu);
    if (state_->mode != HttpExchangeState::Mode::kWaiting || state_->finished) return;
    state_->mode = HttpExchangeState::Mode::kStream;
    state_->response.status = status;
    state_->response.content_type = std::move(content_type);
    state_->response.headers = std::move(headers);
  }
  WakeConnection(*state_);
}

void HttpExchange::Write(std::string_view data) {
  {
    std::lock_guard lock(state_->mu);
    if (state_->mode != HttpExchangeState::Mode::kStream || state_->ended || state_->gone ||
        state_->finished) {
      return;
    }
    state_->pending.append(data);
  }
  WakeConnection(*state_);
}

void HttpExchange::End() {
  {
    std::lock_guard lock(state_->mu);
    if (state_->mode != HttpExchangeState::Mode::kStream || state_->ended || state_->finished) {
      return;
    }
    state_->ended = true;
  }
  WakeConnection(*state_);
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
  // HEAD is GET without the body.
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

// The client's address as text; an IPv4 client of a dual-stack listener as IPv4 ("10.0.0.1",
// not "::ffff:10.0.0.1"), so per-address limits and logs see one address per client.
std::string PeerOf(const tcp::socket& socket) {
  error_code ec;
  net::ip::address address = socket.remote_endpoint(ec).address();
  if (ec) return "";
  if (address.is_v6() && address.to_v6().is_v4_mapped()) {
    address = net::ip::make_address_v4(net::ip::v4_mapped, address.to_v6());
  }
  return address.to_string();
}

// The listening socket on `addr`, or why not.
absl::Status Listen(tcp::acceptor& acceptor, const sockaddr_storage& addr) {
  tcp::endpoint endpoint;
  const size_t size = addr.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  std::memcpy(endpoint.data(), &addr, size);
  endpoint.resize(size);
  error_code ec;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
  // "[::]" takes IPv4 too, as gRPC's listener does.
  if (!ec && addr.ss_family == AF_INET6) acceptor.set_option(net::ip::v6_only(false), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return absl::UnavailableError(ec.message());
  return absl::OkStatus();
}

// Accepts connections until the acceptor closes. Each gets its own strand; the guard decides
// whether it may stay. A failed accept (out of descriptors) is retried after a pause, never
// given up on.
net::awaitable<void> AcceptLoop(const HttpServer* server, tcp::acceptor* acceptor,
                                HttpConnectionGuard* guard, net::io_context* io) {
  net::steady_timer pause(*io);
  for (;;) {
    error_code ec;
    // Named, not a temporary: GCC 12 mishandles temporaries that live across a suspension.
    const net::any_io_executor strand = net::make_strand(*io);
    tcp::socket socket =
        co_await acceptor->async_accept(strand, net::redirect_error(net::use_awaitable, ec));
    if (ec == net::error::operation_aborted || !acceptor->is_open()) co_return;
    if (ec) {
      Log(LogLevel::kDebug, "http_accept_failed", {{"error", ec.message()}});
      pause.expires_after(std::chrono::milliseconds(50));
      co_await pause.async_wait(net::redirect_error(net::use_awaitable, ec));
      continue;
    }
    std::string peer = PeerOf(socket);
    if (!guard->Admit(peer)) continue;  // the socket closes here
    HttpConnections::Serve(*server, std::move(socket), std::move(peer));
  }
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
  server->listener_ = std::make_unique<Listener>();
  Listener& listener = *server->listener_;
  if (absl::Status s = Listen(listener.acceptor, *addr); !s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on '", host_port, "': ", s.message()));
  }
  server->port_ = listener.acceptor.local_endpoint().port();
  net::co_spawn(listener.io,
                AcceptLoop(server.get(), &listener.acceptor, server->guard_.get(), &listener.io),
                net::detached);
  for (int i = 0; i < options.threads; ++i) {
    listener.threads.emplace_back([&io = listener.io] {
      // The acceptor's pending accept keeps run() going until the stop.
      const auto work = net::make_work_guard(io);
      io.run();
    });
  }
  return server;
}

HttpServer::HttpServer(std::vector<HttpRoute> routes, const HttpServerOptions& options)
    : routes_(std::move(routes)), options_(options), gate_(std::make_shared<ServerGate>()) {}

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

void HttpServer::ReportAnswered(std::string_view route, int status) const {
  if (options_.on_answered) options_.on_answered(route, status);
}

void HttpServer::ReportRefused(std::string_view reason) const {
  if (options_.on_refused) options_.on_refused(reason);
}

HttpResponse HttpServer::TooLarge() const {
  return Closing(
      Refusal(413, absl::StrCat("request body larger than ", options_.max_body_bytes, " bytes")));
}

HttpResponse HttpServer::Refusal(int status, const std::string& message) const {
  if (options_.error_response) return options_.error_response(status, message);
  HttpResponse r;
  r.status = status;
  r.body = message + "\n";
  return r;
}

void HttpServer::Register(const std::shared_ptr<HttpExchangeState>& state) const {
  std::lock_guard lock(live_mu_);
  std::erase_if(live_, [](const std::weak_ptr<HttpExchangeState>& w) { return w.expired(); });
  live_.push_back(state);
}

HttpServer::~HttpServer() {
  if (listener_ == nullptr) return;
  {
    // No wake-up is posted to the event loop from now on.
    std::unique_lock gate(gate_->mu);
    gate_->stopped = true;
  }
  listener_->io.stop();
  for (std::thread& t : listener_->threads) t.join();
  // The connections will never answer their exchanges: the routes hear their clients are gone
  // (and cancel the work), and the hang-up watches end before the sockets close.
  std::vector<std::shared_ptr<HttpExchangeState>> live;
  {
    std::lock_guard lock(live_mu_);
    for (const std::weak_ptr<HttpExchangeState>& w : live_) {
      if (auto s = w.lock()) live.push_back(std::move(s));
    }
  }
  for (const std::shared_ptr<HttpExchangeState>& s : live) FinishExchange(*s, false);
  listener_.reset();  // destroys the connections (closing their sockets) and the acceptor
}

}  // namespace specula
