// server.limits.max_requests_per_client: how many generations one client may have in flight at
// once (from admission until its answer is complete, queued or running), so one agent cannot
// take every running slot and queue place of a shared server. The client is its bearer token when
// server.auth is on (one token per agent or tenant), else its IP address.
//
// Thread-safe.
#pragma once

#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specula {

class ClientLimiter {
 public:
  // 0 = no limit.
  explicit ClientLimiter(int max_per_client) : max_(max_per_client) {}

  // One request's place; gives it back when destroyed. Move-only.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { Reset(); }
    void Reset();

   private:
    friend class ClientLimiter;
    Lease(ClientLimiter* owner, std::string client) : owner_(owner), client_(std::move(client)) {}
    ClientLimiter* owner_ = nullptr;
    std::string client_;
  };

  // A place for one more request of `client`; RESOURCE_EXHAUSTED (retry when one ends) when it
  // has max_per_client already. The message does not name the client (it may be a token).
  absl::StatusOr<Lease> Acquire(const std::string& client);
  int in_flight(const std::string& client) const;
  int max_per_client() const { return max_; }

 private:
  void Release(const std::string& client);

  const int max_;
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, int> in_flight_;  // guarded by mu_; no zero entries
};

// Who a request comes from, for the limit: its bearer token (`authorization`, when server.auth is
// on), else the host part of `peer`: gRPC's "ipv4:10.0.0.1:5000" / "ipv6:%5B::1%5D:5000" or
// HTTP's bare address, normalized so one client is one identity on both listeners ("::1",
// "10.0.0.1" also for a dual-stack listener's "::ffff:10.0.0.1").
std::string ClientIdentity(const std::string* authorization, absl::string_view peer);

}  // namespace specula
