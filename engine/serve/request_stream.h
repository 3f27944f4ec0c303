// The hand-off of one request's output from the engine thread to whoever sends it to the client
// (a gRPC reactor, a test). The engine appends as it generates; the consumer takes everything
// pending in one chunk, so a slow reader gets fewer, larger messages instead of a growing backlog
// of small ones.
//
// Threading: Append/Close from the engine thread, Take from any one consumer thread. `on_ready`
// runs on the producer's thread, outside the lock, at most once per Take that found nothing; it
// must not block (a reactor starts a write from it).
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/generate/sequence.h"

namespace specula {

struct TokenUsage {
  int64_t prompt = 0;
  int64_t completion = 0;
  int64_t cached_prompt = 0;  // of `prompt`, served from the prefix cache (docs/SESSIONS.md)
};

struct StreamChunk {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<SampledToken> logprobs;
  // The last chunk: nothing follows. `status` is what the stream ends with (OK when the request
  // finished normally, with `finish` saying why).
  bool done = false;
  absl::Status status;
  FinishReason finish = FinishReason::kNone;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // prompt tokens whose KV came from the prefix cache
  // What the KV cache did for the request (last chunk; unset if it was never admitted).
  std::optional<KvStats> kv_stats;
};

class RequestStream {
 public:
  explicit RequestStream(std::function<void()> on_ready = nullptr)
      : on_ready_(std::move(on_ready)) {}

  // Producer. Appends after Close are ignored.
  void Append(const SequenceOutput& out);
  void Close(absl::Status status, FinishReason finish, const TokenUsage& usage,
             std::optional<KvStats> kv_stats = std::nullopt);

  // Consumer. Moves everything pending (and the end, once closed) into `*chunk` and returns true;
  // returns false when nothing is pending and arms `on_ready` for the next Append or Close.
  // After the chunk with done=true has been taken, returns false forever.
  bool Take(StreamChunk* chunk);

 private:
  void Notify(std::unique_lock<std::mutex>& lock);

  const std::function<void()> on_ready_;
  std::mutex mu_;
  StreamChunk pending_;
  bool has_data_ = false;
  bool closed_ = false;
  bool end_taken_ = false;
  bool armed_ = false;
};

}  // namespace specula
