#include "server/listen_address.h"

#include <netdb.h>
#include <netinet/in.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/config.h"

namespace specula {

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

socklen_t AddressLength(const sockaddr_storage& addr) {
  return addr.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

}  // namespace specula
