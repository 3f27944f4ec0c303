#include "engine/serve/request_stream.h"

#include <utility>

namespace specula {

void RequestStream::Notify(std::unique_lock<std::mutex>& lock) {
  if (!armed_ || !on_ready_) return;
  armed_ = false;
  lock.unlock();
  on_ready_();
}

void RequestStream::Append(const SequenceOutput& out) {
  std::unique_lock lock(mu_);
  if (closed_) return;
  if (out.tokens.empty() && out.text.empty()) return;
  pending_.tokens.insert(pending_.tokens.end(), out.tokens.begin(), out.tokens.end());
  pending_.text += out.text;
  pending_.logprobs.insert(pending_.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
  has_data_ = true;
  Notify(lock);
}

void RequestStream::Close(absl::Status status, FinishReason finish, const TokenUsage& usage,
                          std::optional<KvStats> kv_stats) {
  std::unique_lock lock(mu_);
  if (closed_) return;
  closed_ = true;
  pending_.done = true;
  pending_.status = std::move(status);
  pending_.finish = finish;
  pending_.prompt_tokens = usage.prompt;
  pending_.completion_tokens = usage.completion;
  pending_.cached_prompt_tokens = usage.cached_prompt;
  pending_.kv_stats = kv_stats;
  Notify(lock);
}

bool RequestStream::Take(StreamChunk* chunk) {
  std::lock_guard lock(mu_);
  if (end_taken_ || (!has_data_ && !closed_)) {
    armed_ = !end_taken_;
    return false;
  }
  *chunk = std::exchange(pending_, StreamChunk());
  has_data_ = false;
  end_taken_ = closed_;
  return true;
}

}  // namespace specula
