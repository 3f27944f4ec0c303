#include "engine/generate/kv_manager.h"

#include "absl/time/clock.h"
#include "engine/common/status_macros.h"

namespace specula {

bool KvManager::MakeRoom(const KvRoom& need) {
  return kv_.prefix.MakeRoom(need.pool_blocks, need.host_pages);
}

absl::Status KvManager::BeginHit(Sequence& seq, bool sparse, bool resume) {
  const GenerationRequest& r = seq.request();
  if (resume) {
    seq.prefix_hit() = kv_.prefix.Resume(sparse, TokensOf(seq, seq.num_tokens()), r.session_id);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(seq.prefix_hit(), kv_.prefix.Begin(sparse, r.prompt, r.session_id));
  return absl::OkStatus();
}

void KvManager::AbandonHit(Sequence& seq) {
  kv_.prefix.Finish(
      seq.prefix_hit(), /*kv_valid=*/false, {}, 0,
      [](int64_t) { return absl::Span<const int32_t>(); }, absl::Now());
}

std::vector<int32_t> KvManager::TokensOf(const Sequence& seq, int64_t n) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[i] = seq.TokenAt(i);
  return tokens;
}

}  // namespace specula
