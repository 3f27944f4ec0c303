#include "engine/generate/dense_kv_manager.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "engine/common/status_macros.h"

namespace specula {

int64_t DenseKvManager::InitialTokens(const Sequence& seq) {
  return std::min(seq.max_total_tokens(), seq.kv_len() + seq.prefill_remaining() + 1);
}

bool DenseKvManager::HasRoom(const PrefixCache::Peek& hit, int64_t initial,
                             const KvRoom& reserved) const {
  // A host hit is copied into blocks of its own (only a pool hit saves blocks) and leaves every
  // reclaimable pool block reclaimable.
  const int64_t cached_blocks = hit.host ? 0 : hit.tokens / page_size();
  const int64_t free_blocks =
      kv_.pool.free_blocks() + (hit.host ? kv_.prefix.reclaimable_blocks() : hit.reclaimable_after);
  return free_blocks >= kv_.pool.BlocksFor(initial) - cached_blocks + reserved.pool_blocks;
}

bool DenseKvManager::HasRoomFor(const GenerationRequest& request, int64_t total,
                                const KvRoom& reserved) const {
  const PrefixCache::Peek hit =
      kv_.prefix.PeekHit(/*sparse=*/false, request.prompt, request.session_id);
  return HasRoom(hit, std::min<int64_t>(total, static_cast<int64_t>(request.prompt.size()) + 1),
                 reserved);
}

bool DenseKvManager::HasRoomToResume(const Sequence& seq, const KvRoom& reserved) const {
  const PrefixCache::Peek hit = kv_.prefix.PeekHit(
      /*sparse=*/false, TokensOf(seq, seq.num_tokens()), seq.request().session_id, /*always=*/true);
  return HasRoom(hit, InitialTokens(seq), reserved);
}

absl::Status DenseKvManager::Attach(Sequence& seq, bool resume) {
  RETURN_IF_ERROR(BeginHit(seq, /*sparse=*/false, resume));
  std::vector<int32_t> shared;
  kv_.prefix.HitPages(seq.prefix_hit(), &shared);
  // What it needs now; it grows a block at a time as it decodes (preempted when the pool runs
  // out).
  const int64_t total = InitialTokens(seq);
  const absl::Status status = seq.prefix_hit().host ? ReloadFromHost(seq, total, shared)
                                                    : AttachBlocks(seq, total, std::move(shared));
  if (!status.ok()) {
    AbandonHit(seq);
    return status;
  }
  if (seq.prefix_hit().tokens > 0) seq.SkipCachedPrefix(seq.prefix_hit().tokens);
  // Its whole block list, so decode's growth does not move it.
  seq.blocks().reserve(kv_.pool.BlocksFor(seq.max_total_tokens()));
  return absl::OkStatus();
}

absl::Status DenseKvManager::AttachBlocks(Sequence& seq, int64_t total,
                                          std::vector<int32_t> shared) {
  const PrefixHit& hit = seq.prefix_hit();
  const int64_t fresh = kv_.pool.BlocksFor(total) - static_cast<int64_t>(shared.size());
  // The tail's block stays this request's to read until its copy is enqueued, whatever MakeRoom
  // evicts meanwhile.
  kv_.pool.Retain(hit.tail_pages);
  kv_.prefix.MakeRoom(fresh, 0);
  std::vector<int32_t> blocks;
  const absl::Status allocated = kv_.pool.AllocateInto(static_cast<int32_t>(fresh), &blocks);
  if (allocated.ok()) {
    // Copy-on-write: the partly reused block becomes the first block this request writes.
    if (hit.tail_tokens > 0) {
      kv_.pool.CopyBlock(kv_.backend.compute_stream(), hit.tail_pages[0], blocks[0]);
    }
    kv_.pool.Retain(shared);
    seq.blocks() = std::move(shared);
    seq.blocks().insert(seq.blocks().end(), blocks.begin(), blocks.end());
  }
  kv_.pool.Free(hit.tail_pages);
  return allocated;
}

absl::Status DenseKvManager::ReloadFromHost(Sequence& seq, int64_t total,
                                            absl::Span<const int32_t> host_pages) {
  const PrefixHit& hit = seq.prefix_hit();
  const int32_t blocks = kv_.pool.BlocksFor(total);
  // Making room evicts pool blocks only: the hit's pages (locked) and its tail's stay.
  kv_.prefix.MakeRoom(blocks, 0);
  std::vector<int32_t> fresh;
  RETURN_IF_ERROR(kv_.pool.AllocateInto(blocks, &fresh));
  const HostKvStore& host = *kv_.host;
  const size_t pages_per_block = static_cast<size_t>(host.num_layers()) * host.num_kv_heads();
  const size_t whole = host_pages.size() / pages_per_block;
  Stream& stream = kv_.backend.compute_stream();
  kv_.pool.CopyFromHost(stream, host.pool(), host_pages, absl::MakeConstSpan(fresh).first(whole));
  if (hit.tail_tokens > 0) {
    kv_.pool.CopyFromHost(stream, host.pool(), hit.tail_pages,
                          absl::MakeConstSpan(fresh).subspan(whole, 1));
  }
  seq.blocks() = std::move(fresh);
  return absl::OkStatus();
}

KvRoom DenseKvManager::Growth(const Sequence& seq) const {
  const bool past_last_block =
      seq.kv_len() / page_size() >= static_cast<int64_t>(seq.blocks().size());
  return {.pool_blocks = !seq.in_prefill() && past_last_block ? 1 : 0};
}

absl::Status DenseKvManager::Grow(Sequence& seq) { return kv_.pool.AllocateInto(1, &seq.blocks()); }

bool DenseKvManager::Preemptible(const Sequence& seq) const {
  // Its KV is complete up to kv_len, in prefill or not.
  (void)seq;
  return true;
}

void DenseKvManager::Park(Sequence& seq) {
  CacheKv(seq, /*kv_valid=*/true, /*park=*/true);
  kv_.pool.Free(seq.blocks());
}

int64_t DenseKvManager::ChoosePrefill(Sequence& seq, int64_t budget, ScheduledStep& step) {
  (void)step;
  return std::min(budget, seq.prefill_remaining());
}

void DenseKvManager::AddRow(Sequence& seq, int64_t n, bool prefill, ScheduledStep& step) const {
  const int32_t q_begin = step.AppendTokens(seq, n);
  const auto kv_len = static_cast<int32_t>(seq.kv_len() + n);
  step.dense.push_back({q_begin, static_cast<int32_t>(n), kv_len,
                        absl::MakeConstSpan(seq.blocks()).subspan(0, kv_.pool.BlocksFor(kv_len))});
  step.AddRow(seq, n, prefill, q_begin);
}

int64_t DenseKvManager::Advance(const ScheduledRow& row) {
  row.seq->AdvanceKv(row.n, row.prefill);
  return row.n;
}

void DenseKvManager::Release(Sequence& seq, bool kv_valid) {
  CacheKv(seq, kv_valid, /*park=*/false);
  kv_.pool.Free(seq.blocks());
}

bool DenseKvManager::OffloadToHost(Sequence& seq, absl::Span<const int32_t> tokens,
                                   int64_t blocks) {
  std::unique_ptr<PrefixCache::Offload> offload =
      kv_.prefix.BeginOffload(seq.prefix_hit(), tokens, blocks);
  if (offload == nullptr) return false;
  const auto first = static_cast<size_t>(offload->first_block);
  const auto end = static_cast<size_t>(offload->end_block);
  const HostKvStore& host = *kv_.host;
  kv_.pool.CopyToHost(kv_.backend.compute_stream(),
                      absl::MakeConstSpan(seq.blocks()).subspan(first, end - first), host.pool(),
                      offload->block_major);
  if (sparse_ != nullptr) {
    // A later sparse turn of the session scores these pages (a tail it never uses).
    const size_t summarized =
        (static_cast<size_t>(blocks) - first) * host.num_layers() * host.num_kv_heads();
    sparse_->SummarizeLater(absl::MakeConstSpan(offload->block_major).first(summarized));
  }
  kv_.prefix.FinishOffload(seq.prefix_hit(), *offload, tokens, blocks, absl::Now());
  return true;
}

void DenseKvManager::CacheKv(Sequence& seq, bool kv_valid, bool park) {
  const int64_t blocks = kv_valid ? seq.kv_len() / page_size() : 0;
  const std::vector<int32_t> tokens = TokensOf(seq, kv_valid ? seq.kv_len() : 0);
  auto pages_of = [&](int64_t block) { return absl::MakeConstSpan(&seq.blocks()[block], 1); };
  if (park) {
    kv_.prefix.Park(seq.prefix_hit(), tokens, blocks, pages_of);
    return;
  }
  // A session's turn leaves its KV in host memory, the pool to running requests.
  if (kv_valid && OffloadToHost(seq, tokens, blocks)) return;
  kv_.prefix.Finish(seq.prefix_hit(), kv_valid, tokens, blocks, pages_of, absl::Now());
}

}  // namespace specula
