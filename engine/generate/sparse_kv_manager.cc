#include "engine/generate/sparse_kv_manager.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/common/check.h"
#include "engine/common/status_macros.h"

namespace specula {

int64_t SparseKvManager::TokensNow(int64_t total, int64_t tokens) {
  // Admission takes what the prefill writes plus the first growth, not the whole of max_tokens.
  return std::min(total, tokens + 1 + kGrowthTokens);
}

int64_t SparseKvManager::HostPages(int64_t pages_per_head) const {
  return pages_per_head * kv_.host->num_layers() * kv_.host->num_kv_heads();
}

bool SparseKvManager::HasRoom(const PrefixCache::Peek& hit, int64_t total, int64_t tokens,
                              int64_t budget_tokens, const KvRoom& reserved) const {
  const int64_t cached_blocks = hit.tokens / page_size();
  // A host hit leaves every reclaimable pool block reclaimable.
  const int64_t free_blocks =
      kv_.pool.free_blocks() + (hit.host ? kv_.prefix.reclaimable_blocks() : hit.reclaimable_after);
  const int64_t host_pages =
      HostPages(kv_.host->PagesFor(TokensNow(total, tokens)) - cached_blocks);
  const int64_t slots = cache_.Geometry(total, budget_tokens).slots_per_head();
  return kv_.host->free_pages() + hit.reclaimable_after - reserved.host_pages >= host_pages &&
         free_blocks - reserved.pool_blocks >= slots;
}

bool SparseKvManager::HasRoomFor(const GenerationRequest& request, int64_t total,
                                 const KvRoom& reserved) const {
  const PrefixCache::Peek hit =
      kv_.prefix.PeekHit(/*sparse=*/true, request.prompt, request.session_id);
  return HasRoom(hit, total, static_cast<int64_t>(request.prompt.size()),
                 request.sparse.budget_tokens, reserved);
}

bool SparseKvManager::HasRoomToResume(const Sequence& seq, const KvRoom& reserved) const {
  const PrefixCache::Peek hit = kv_.prefix.PeekHit(/*sparse=*/true, TokensOf(seq, seq.num_tokens()),
                                                   seq.request().session_id, /*always=*/true);
  return HasRoom(hit, seq.max_total_tokens(), seq.num_tokens(), seq.request().sparse.budget_tokens,
                 reserved);
}

absl::Status SparseKvManager::Attach(Sequence& seq, bool resume) {
  RETURN_IF_ERROR(BeginHit(seq, /*sparse=*/true, resume));
  const GenerationRequest& r = seq.request();
  std::vector<int32_t> shared;
  kv_.prefix.HitPages(seq.prefix_hit(), &shared);
  const int64_t cached_blocks = seq.prefix_hit().tokens / page_size();
  // Host pages for what it holds now (it grows as it decodes); device slots for its whole
  // length (its working set is sized for it).
  const int64_t total = seq.max_total_tokens();
  const int64_t now = TokensNow(total, seq.kv_len() + seq.prefill_remaining());
  kv_.prefix.MakeRoom(cache_.Geometry(total, r.sparse.budget_tokens).slots_per_head(),
                      HostPages(kv_.host->PagesFor(now) - cached_blocks));
  absl::StatusOr<std::shared_ptr<WorkingSet>> ws = cache_.Admit(
      total, r.sparse.budget_tokens, static_cast<int64_t>(r.prompt.size()), shared, now);
  if (!ws.ok()) {
    AbandonHit(seq);
    return ws.status();
  }
  seq.set_sparse_kv(*std::move(ws));
  if (seq.prefix_hit().tokens > 0) seq.SkipCachedPrefix(seq.prefix_hit().tokens);
  // The prefill job holds the prompt's activations and one layer's KV on the device until it is
  // done, so they are had (or refused) now. A resumed sequence prefills its output so far too.
  absl::StatusOr<std::unique_ptr<SparsePrefill>> job = SparsePrefill::Create(
      model_, cache_, *seq.sparse_kv(), resume ? TokensOf(seq, seq.num_tokens()) : r.prompt,
      seq.kv_len(), prefill_chunk_tokens_);
  if (!job.ok()) {
    CacheKv(seq, /*kv_valid=*/false, /*park=*/false);
    ReleaseWorkingSet(seq);
    return job.status();
  }
  prefills_[seq.id()] = *std::move(job);
  return absl::OkStatus();
}

KvRoom SparseKvManager::Growth(const Sequence& seq) const {
  const HostKvSequence& host = seq.sparse_kv()->host();
  if (seq.in_prefill() || seq.kv_len() + 1 <= host.allocated_tokens()) return {};
  const int64_t target = kv_.host->PagesFor(TokensNow(seq.max_total_tokens(), seq.kv_len()));
  return {.host_pages = HostPages(target - host.allocated_pages_per_head())};
}

absl::Status SparseKvManager::Grow(Sequence& seq) {
  return cache_.Grow(*seq.sparse_kv(), TokensNow(seq.max_total_tokens(), seq.kv_len()));
}

void SparseKvManager::Park(Sequence& seq) {
  // Its whole pages are complete: written back when they filled, on the compute stream, before
  // the last step's synchronization.
  CHECK(!seq.in_prefill()) << "a sparse sequence is preempted while it prefills";
  CacheKv(seq, /*kv_valid=*/true, /*park=*/true);
  ReleaseWorkingSet(seq);
}

int64_t SparseKvManager::ChoosePrefill(Sequence& seq, int64_t budget, ScheduledStep& step) {
  if (step.sparse_prefill != nullptr) return 0;  // one layer-major prefill at a time
  step.sparse_prefill = prefills_.at(seq.id()).get();
  step.sparse_prefill_seq = &seq;
  step.sparse_layer_tokens = budget * model_.config().num_hidden_layers;
  return budget;
}

void SparseKvManager::AddRow(Sequence& seq, int64_t n, bool prefill, ScheduledStep& step) const {
  if (prefill) {
    // The layer-major prefill's units run apart from the batched forward pass; Plan marks the
    // row as sampling when its last unit runs.
    step.rows.push_back({&seq, 0, true, false});
    return;
  }
  CHECK_EQ(n, 1);
  const int32_t q_begin = step.AppendTokens(seq, 1);
  step.sparse_decode.push_back(
      {seq.sparse_kv().get(), q_begin, static_cast<int32_t>(seq.kv_len())});
  step.AddRow(seq, 1, /*prefill=*/false, q_begin);
}

void SparseKvManager::EndStep(const ScheduledStep& step) {
  cache_.EndStep();
  if (step.sparse_prefill != nullptr) step.sparse_prefill->EndStep();
}

void SparseKvManager::FinishStep(const ScheduledStep& step, SparseStepStats* stats) {
  cache_.FinishStep(stats);
  if (step.sparse_prefill != nullptr) step.sparse_prefill->FinishStep(stats);
}

int64_t SparseKvManager::Advance(const ScheduledRow& row) {
  Sequence& seq = *row.seq;
  if (!row.prefill) {
    seq.AdvanceKv(row.n, /*prefill=*/false);
    return row.n;
  }
  if (!row.sample) return 0;  // the layer-major prefill goes on
  const int64_t written = seq.prefill_remaining();
  prefills_.erase(seq.id());
  seq.AdvanceKv(written, /*prefill=*/true);
  return written;
}

absl::Status SparseKvManager::TakeStepError() {
  const absl::Status copy = cache_.prefetcher().TakeCopyError();
  if (copy.ok()) return copy;
  return absl::InternalError(absl::StrCat("a prefetch copy of this request's KV pages failed (",
                                          copy.message(), "); its KV cache was discarded"));
}

void SparseKvManager::Release(Sequence& seq, bool kv_valid) {
  prefills_.erase(seq.id());
  // Its pages' write-backs ran on the compute stream before the last step's synchronization, so
  // the pages the cache takes are complete.
  CacheKv(seq, kv_valid, /*park=*/false);
  if (seq.sparse_kv() != nullptr) ReleaseWorkingSet(seq);
}

KvStats SparseKvManager::Stats(const Sequence& seq) const {
  // Waits for the sequence's prefetch copies in flight.
  return seq.sparse_kv() == nullptr ? KvStats() : cache_.Stats(*seq.sparse_kv());
}

void SparseKvManager::CacheKv(Sequence& seq, bool kv_valid, bool park) {
  const int64_t blocks = kv_valid ? seq.kv_len() / page_size() : 0;
  const std::vector<int32_t> tokens = TokensOf(seq, blocks * page_size());
  auto pages_of = [&](int64_t block) -> absl::Span<const int32_t> {
    block_pages_.clear();
    seq.sparse_kv()->host().AppendBlockPages(static_cast<int32_t>(block), &block_pages_);
    return block_pages_;
  };
  if (park) {
    kv_.prefix.Park(seq.prefix_hit(), tokens, blocks, pages_of);
  } else {
    kv_.prefix.Finish(seq.prefix_hit(), kv_valid, tokens, blocks, pages_of, absl::Now());
  }
}

void SparseKvManager::ReleaseWorkingSet(Sequence& seq) {
  cache_.Release(*seq.sparse_kv());
  seq.set_sparse_kv(nullptr);
}

}  // namespace specula
