// The stored responses of the Responses API (previous_response_id, GET and DELETE
// /v1/responses/{id}), kept apart from the KV: each holds its own turn (input and output as
// canonical chat messages, server/responses_request.h) and the response it continued, so a
// conversation costs memory linear in its length. Bounded by count and idle time
// (responses.max_stored, responses.ttl_seconds); the least recently used go first. A response
// dropped from the index stays alive as long as a stored response continues it (its turns are
// part of that conversation), but cannot be fetched or continued by its own id.
// Thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "server/request_json.h"

namespace specula {

struct StoredResponse {
  StoredResponse() = default;
  StoredResponse(const StoredResponse&) = delete;
  StoredResponse& operator=(const StoredResponse&) = delete;
  // Releases the chain behind it one link at a time: a conversation can be as long as the
  // context has tokens, too deep for destructors that recurse.
  ~StoredResponse();

  std::string id;
  OrderedJson response;  // the response object as GET returns it
  OrderedJson turn;      // this turn's input and output, canonical messages
  std::shared_ptr<const StoredResponse> previous;  // the response it continued, or null

  // The turns of the conversation ending with this response, oldest first.
  std::vector<const OrderedJson*> Conversation() const;
};

class ResponseStore {
 public:
  // max_stored > 0; ttl > 0.
  ResponseStore(int64_t max_stored, absl::Duration ttl);

  void Put(std::shared_ptr<const StoredResponse> response, absl::Time now = absl::Now());
  // Null when unknown or idle past the TTL (then dropped). A hit counts as use.
  std::shared_ptr<const StoredResponse> Find(const std::string& id, absl::Time now = absl::Now());
  // Whether it was there.
  bool Erase(const std::string& id);
  int64_t size() const;

 private:
  struct Entry {
    std::shared_ptr<const StoredResponse> response;
    absl::Time last_used;
    std::list<std::string>::iterator lru;  // position in lru_
  };
  void DropExpired(absl::Time now);  // mu_ held

  const int64_t max_stored_;
  const absl::Duration ttl_;
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_;
  std::list<std::string> lru_;  // least recently used first
};

}  // namespace specula
