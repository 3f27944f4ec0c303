#include "server/client_limiter.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "server/bearer_tokens.h"

namespace specula {

ClientLimiter::Lease::Lease(Lease&& other) noexcept
    : owner_(other.owner_), client_(std::move(other.client_)) {
  other.owner_ = nullptr;
}

ClientLimiter::Lease& ClientLimiter::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Reset();
    owner_ = other.owner_;
    client_ = std::move(other.client_);
    other.owner_ = nullptr;
  }
  return *this;
}

void ClientLimiter::Lease::Reset() {
  if (owner_ != nullptr) owner_->Release(client_);
  owner_ = nullptr;
}

absl::StatusOr<ClientLimiter::Lease> ClientLimiter::Acquire(const std::string& client) {
  if (max_ <= 0) return Lease();
  std::lock_guard lock(mu_);
  int& n = in_flight_[client];
  if (n >= max_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this client already has ", n,
        " requests in flight (server.limits.max_requests_per_client); retry when one ends"));
  }
  ++n;
  return Lease(this, client);
}

int ClientLimiter::in_flight(const std::string& client) const {
  std::lock_guard lock(mu_);
  auto it = in_flight_.find(client);
  return it == in_flight_.end() ? 0 : it->second;
}

void ClientLimiter::Release(const std::string& client) {
  std::lock_guard lock(mu_);
  auto it = in_flight_.find(client);
  if (it == in_flight_.end()) return;
  if (--it->second <= 0) in_flight_.erase(it);
}

std::string ClientIdentity(const std::string* authorization, absl::string_view peer) {
  if (authorization != nullptr) {
    // The token alone, however the scheme is spelled (the request passed authentication, so it
    // is a bearer token).
    return absl::StrCat("token ",
                        BearerTokenOf(*authorization).value_or(absl::string_view(*authorization)));
  }
  for (absl::string_view scheme : {"ipv4:", "ipv6:"}) {
    if (absl::StartsWith(peer, scheme)) peer.remove_prefix(scheme.size());
  }
  // gRPC percent-encodes the brackets of an IPv6 peer ("ipv6:%5B::1%5D:5000").
  std::string host = absl::StrReplaceAll(peer, {{"%5B", "["}, {"%5D", "]"}});
  // "[::1]:5000" -> "::1", "10.0.0.1:5000" -> "10.0.0.1"; a bare address stays.
  if (!host.empty() && host.front() == '[') {
    const size_t close = host.find(']');
    host = host.substr(1, close == std::string::npos ? std::string::npos : close - 1);
  } else if (const size_t colon = host.rfind(':');
             colon != std::string::npos && host.find(':') == colon) {
    host.resize(colon);
  }
  // One client, one count on both listeners: a dual-stack listener sees an IPv4 client as
  // ::ffff:10.0.0.1, gRPC as 10.0.0.1.
  if (absl::StartsWith(host, "::ffff:") && host.find('.') != std::string::npos) {
    host.erase(0, 7);
  }
  return absl::StrCat("ip ", host);
}

}  // namespace specula
