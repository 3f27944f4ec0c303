#include "server/grpc_acceptor.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "engine/common/log.h"
#include "grpcpp/server.h"
#include "grpcpp/server_posix.h"
#include "server/listen_address.h"

namespace specula {
namespace {

// After a failed accept (out of descriptors) the loop waits this long before trying again.
constexpr int kRetryPauseMs = 100;
// Refusals and failures are logged at most this often (the counters keep the exact numbers).
constexpr absl::Duration kLogEvery = absl::Seconds(10);
// At the connection limit, the open connections are counted again at most this often: a flood
// of refused connections must not cost a look at every open one each.
constexpr std::chrono::milliseconds kRecountEvery(20);

absl::Status BindError(const std::string& host_port, const std::string& why) {
  return absl::UnavailableError(absl::StrFormat(
      "server.listen: cannot listen on %s (%s)", host_port, why));
}

// A bound, listening, non-blocking socket for the address `host_port` resolves to. A malformed
// address is INVALID_ARGUMENT (ParseHostPort's), any other failure UNAVAILABLE naming the key.
absl::StatusOr<int> BindAndListen(const std::string& host_port) {
  absl::StatusOr<sockaddr_storage> addr = ResolveListenAddress(host_port);
  if (absl::IsInvalidArgument(addr.status())) return addr.status();
  if (!addr.ok()) return BindError(host_port, std::string(addr.status().message()));
  const int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return BindError(host_port, std::strerror(errno));
  // As gRPC's own listener: a restart may bind while old connections are in TIME_WAIT. No
  // SO_REUSEPORT: a second daemon on the port must fail, not share the connections.
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<const sockaddr*>(&*addr), AddressLength(*addr)) != 0 ||
      listen(fd, SOMAXCONN) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    return BindError(host_port, why);
  }
  return fd;
}

int BoundPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcAcceptor>> GrpcAcceptor::Listen(const std::string& host_port) {
  absl::StatusOr<int> fd = BindAndListen(host_port);
  if (!fd.ok()) return fd.status();
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    close(*fd);
    return absl::InternalError(absl::StrCat("server.listen: eventfd: ", std::strerror(errno)));
  }
  return std::unique_ptr<GrpcAcceptor>(new GrpcAcceptor(*fd, wake, BoundPort(*fd)));
}

GrpcAcceptor::~GrpcAcceptor() {
  Stop();
  close(wake_fd_);
}

int GrpcAcceptor::DefaultDescriptorCeiling() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY ||
      limit.rlim_cur > static_cast<rlim_t>(INT_MAX)) {
    return INT_MAX;
  }
  const int soft = static_cast<int>(limit.rlim_cur);
  return std::max(1, soft - std::max(64, soft / 8));
}

void GrpcAcceptor::Start(grpc::Server* server, Options options) {
  server_ = server;
  options_ = std::move(options);
  thread_ = std::thread([this] { Loop(); });
}

void GrpcAcceptor::Stop() {
  if (stop_.exchange(true)) return;
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
}

void GrpcAcceptor::Loop() {
  bool pause = false;
  while (!stop_.load()) {
    if (pause) {  // wait out the pause (the pending connection stays queued); Stop() ends it
      pollfd wake = {wake_fd_, POLLIN, 0};
      poll(&wake, 1, kRetryPauseMs);
      pause = false;
      continue;
    }
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) <= 0 || stop_.load()) continue;
    if (fds[0].revents & POLLIN) pause = !AcceptPending();
  }
}

bool GrpcAcceptor::AcceptPending() {
  while (!stop_.load()) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= options_.descriptor_ceiling) {
      Refuse(fd, "descriptor_reserve", "descriptors near the limit");
      continue;
    }
    if (fd >= 0 && AtConnectionLimit()) {
      Refuse(fd, "connection_limit", "server.connections.grpc_max_connections reached");
      continue;
    }
    if (fd >= 0) {
      const int one = 1;  // as gRPC's own listener: small frames go out at once
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      if (options_.max_connections > 0) handed_.Add(fd);
      grpc::AddInsecureChannelFromFd(server_, fd);
      continue;
    }
    const int e = errno;
    if (e == EAGAIN || e == EWOULDBLOCK) return true;
    if (e == EINTR || e == ECONNABORTED || e == EPROTO) continue;
    ++accept_errors_;
    if (options_.on_accept_error) options_.on_accept_error();
    MaybeLog("grpc_accept_failed", std::strerror(e));
    // Out of descriptors (EMFILE, ENFILE) or memory: pause, then accept again. Anything else
    // too: a listener that stops for good is what this class exists to avoid.
    return false;
  }
  return true;
}

bool GrpcAcceptor::AtConnectionLimit() {
  const int limit = options_.max_connections;
  if (limit <= 0 || handed_.recorded() < limit) return false;
  // Monotonic: a wall clock stepped back must not stretch the pause into refusing for good.
  const auto now = std::chrono::steady_clock::now();
  if (now - last_full_count_ < kRecountEvery) return true;
  if (handed_.CountOpen() < limit) return false;
  last_full_count_ = now;
  return true;
}

void GrpcAcceptor::Refuse(int fd, const char* reason, const std::string& why) {
  // Counted before the client can see the close: whoever saw it reads the count with it.
  ++refused_;
  if (options_.on_refused) options_.on_refused(reason);
  close(fd);
  MaybeLog("grpc_connection_refused", why);
}

void GrpcAcceptor::MaybeLog(const char* event, const std::string& why) {
  const absl::Time now = absl::Now();
  if (now - last_log_ < kLogEvery) return;
  last_log_ = now;
  Log(LogLevel::kWarning, event,
      {{"error", why}, {"refused_total", refused_},
       {"accept_errors_total", accept_errors_},
       {"descriptor_ceiling", options_.descriptor_ceiling},
       {"max_connections", options_.max_connections},
       {"action", "closing new connections until some close; retrying accept"}});
}

}  // namespace specula
