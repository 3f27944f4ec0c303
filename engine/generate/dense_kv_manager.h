// Dense KV: a sequence holds KV-pool blocks for every token so far, taken a block at a time as it
// decodes. Its prefix-cache hit shares the pool's blocks (copy-on-write of a partly reused one),
// or is copied in from host pages (a session's turn offloaded there); a finished session turn's
// KV moves to host pages when a host store is there (docs/SESSIONS.md).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/generate/kv_manager.h"

namespace specula {

class DenseKvManager final : public KvManager {
 public:
  // `sparse` (null without a sparse cache) summarizes offloaded pages for later sparse turns.
  DenseKvManager(const KvResources& kv, SparseKvCache* sparse) : KvManager(kv), sparse_(sparse) {}

  bool HasRoomFor(const GenerationRequest& request, int64_t total,
                  const KvRoom& reserved) const override;
  bool HasRoomToResume(const Sequence& seq, const KvRoom& reserved) const override;
  absl::Status Attach(Sequence& seq, bool resume) override;
  // One block when the next token's position is past the last block.
  KvRoom Growth(const Sequence& seq) const override;
  absl::Status Grow(Sequence& seq) override;
  bool Preemptible(const Sequence& seq) const override;
  void Park(Sequence& seq) override;
  int64_t ChoosePrefill(Sequence& seq, int64_t budget, ScheduledStep& step) override;
  void AddRow(Sequence& seq, int64_t n, bool prefill, ScheduledStep& step) const override;
  int64_t Advance(const ScheduledRow& row) override;
  void Release(Sequence& seq, bool kv_valid) override;

 private:
  // Tokens a sequence starts with: what it prefills plus its first sampled token.
  static int64_t InitialTokens(const Sequence& seq);
  // Whether a sequence starting with `initial` tokens fits beside `reserved` with `hit`.
  bool HasRoom(const PrefixCache::Peek& hit, int64_t initial, const KvRoom& reserved) const;
  // The `shared` whole pages of the hit, then fresh blocks for `total` tokens, the first a copy
  // of the hit's tail when it has one.
  absl::Status AttachBlocks(Sequence& seq, int64_t total, std::vector<int32_t> shared);
  // A hit in host pages: fresh blocks for `total` tokens, the hit's pages (and its tail's)
  // copied into the first of them.
  absl::Status ReloadFromHost(Sequence& seq, int64_t total, absl::Span<const int32_t> host_pages);
  // A finished session turn's KV (`tokens`: `blocks` whole blocks, then a tail) moves to host
  // pages and becomes the session's; false (nothing done) when it cannot (no host store, no
  // session, no room), and the caller caches it in the pool's index.
  bool OffloadToHost(Sequence& seq, absl::Span<const int32_t> tokens, int64_t blocks);
  // Its full blocks, and the partly filled last one (a tail, copied on reuse), to the prefix
  // cache; with `park`, evictable, to be found again by Resume.
  void CacheKv(Sequence& seq, bool kv_valid, bool park);

  SparseKvCache* sparse_;
};

}  // namespace specula
