#include "engine/generate/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/backend/backend_factory.h"
#include "engine/common/capacity_error.h"
#include "engine/common/ceil_div.h"
#include "engine/common/check.h"
#include "engine/common/fault_injection.h"
#include "engine/common/status_macros.h"
#include "engine/kv/kv_dtype.h"
#include "engine/kv/sparse_decode.h"

namespace specula {

namespace {

// Seconds between calls to Lap (the first counts from construction): the load timings.
class Stopwatch {
 public:
  double Lap() {
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    return seconds;
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

// Host pages a sparse sequence takes beyond what it has written, at admission and each time
// decode reaches its last allocated page (tokens; rounded up to whole pages).
constexpr int64_t kSparseGrowthTokens = 256;

// The host KV store kv_cache.host_capacity_tokens asks for (null for none), of the KV pool's page
// layout and dtype, in the backend's pinned memory.
absl::StatusOr<std::unique_ptr<HostKvStore>> CreateHostStore(const GeneratorOptions& options,
                                                             const KvPool& pool, Backend& backend) {
  const int64_t tokens = options.effective_host_capacity_tokens();
  if (options.host_capacity_tokens < -1 || tokens > (int64_t{1} << 30) ||
      (tokens == 0 && options.sparse.enabled)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "kv_cache.host_capacity_tokens = %d: must be in [1, 2^30] (-1: %d with sparse.enabled, "
        "else none; 0: none, which sparse.enabled cannot run without)",
        options.host_capacity_tokens, GeneratorOptions::kDefaultHostCapacityTokens));
  }
  if (tokens == 0) return nullptr;
  absl::StatusOr<std::unique_ptr<HostKvStore>> store =
      HostKvStore::Create(pool.HostStoreOptions(tokens),
                          [&backend](size_t bytes) { return backend.AllocatePinnedHost(bytes); });
  if (!store.ok()) {
    return absl::Status(store.status().code(),
                        absl::StrFormat("kv_cache.host_capacity_tokens = %d: %s", tokens,
                                        store.status().message()));
  }
  return store;
}
}  // namespace

absl::StatusOr<std::unique_ptr<Generator>> Generator::Create(const std::string& model_dir,
                                                             const GeneratorOptions& options) {
  if (options.page_size <= 0 || options.kv_cache_tokens < options.page_size ||
      options.kv_cache_tokens / options.page_size > std::numeric_limits<int32_t>::max() ||
      options.prefill_chunk_tokens <= 0 || options.max_running <= 0 ||
      options.solo_prefill_chunk_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "generator options: page_size (%d), prefill_chunk_tokens (%d) and max_running (%d) must "
        "be positive, solo_prefill_chunk_tokens (%d) not negative and kv_cache_tokens (%d) "
        "between one page and 2^31 pages",
        options.page_size, options.prefill_chunk_tokens, options.max_running,
        options.solo_prefill_chunk_tokens, options.kv_cache_tokens));
  }
  std::unique_ptr<Generator> g(new Generator());
  g->options_ = options;
  BackendOptions backend;
  backend.device = options.device;
  backend.threads = options.threads;
  Stopwatch clock;
  ASSIGN_OR_RETURN(g->backend_, CreateBackend(backend));
  g->load_timings_.backend_seconds = clock.Lap();
  ASSIGN_OR_RETURN(g->model_, Transformer::Load(model_dir, *g->backend_));
  g->load_timings_.weights_seconds = clock.Lap();
  // The model's vocabulary bounds the tokenizer's ids before anything is sized by them.
  ASSIGN_OR_RETURN(g->tokenizer_,
                   Tokenizer::FromDirectory(model_dir, g->model_->config().vocab_size));
  ASSIGN_OR_RETURN(GenerationConfig gen, LoadGenerationConfig(model_dir));
  const ModelConfig& c = g->model_->config();
  if (g->tokenizer_->vocab_size() > c.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: tokenizer has %d ids but config.json vocab_size is %d", model_dir,
                        g->tokenizer_->vocab_size(), c.vocab_size));
  }
  for (int64_t id : gen.eos_token_ids) g->eos_ids_.insert(static_cast<int32_t>(id));
  for (int64_t id : c.eos_token_ids) g->eos_ids_.insert(static_cast<int32_t>(id));
  if (auto eos = g->tokenizer_->eos_token_id()) g->eos_ids_.insert(*eos);
  g->token_table_ = std::make_unique<grammar::TokenTable>(GrammarTokenTable(*g->tokenizer_));
  // Half the cores, at most 8: an entry takes ~50-100 ms on one core at a 128K vocabulary. The
  // threads start with the first constrained request's first entry.
  g->masker_ = std::make_unique<grammar::TokenMasker>(
      *g->token_table_,
      std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 2, 1, 8));
  g->mask_worker_ = std::make_unique<MaskWorker>(*g->masker_);

  KvPoolOptions kv;
  kv.num_layers = static_cast<int32_t>(c.num_hidden_layers);
  kv.num_kv_heads = static_cast<int32_t>(c.num_key_value_heads);
  kv.head_dim = static_cast<int32_t>(c.head_dim);
  kv.page_size = options.page_size;
  kv.num_blocks = static_cast<int32_t>(options.kv_cache_tokens / options.page_size);
  absl::StatusOr<DType> kv_dtype =
      ResolveKvDtype(options.kv_dtype, g->backend_->default_kv_dtype());
  if (!kv_dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_cache.dtype: ", kv_dtype.status().message()));
  }
  kv.dtype = *kv_dtype;
  clock.Lap();  // the tokenizer and generation config are not the KV's time
  absl::StatusOr<KvPool> pool = KvPool::Create(*g->backend_, kv);
  if (!pool.ok()) {
    return absl::Status(pool.status().code(),
                        absl::StrFormat("kv_cache.capacity_tokens: %d tokens of KV cache for this "
                                        "model do not fit: %s",
                                        options.kv_cache_tokens, pool.status().message()));
  }
  g->kv_ = *std::move(pool);
  ASSIGN_OR_RETURN(g->host_, CreateHostStore(options, g->kv_, *g->backend_));
  g->load_timings_.kv_seconds = clock.Lap();
  if (options.sparse.enabled) {
    SparseModelShape shape;
    shape.layers = kv.num_layers;
    shape.heads = static_cast<int32_t>(c.num_attention_heads);
    shape.kv_heads = kv.num_kv_heads;
    shape.head_dim = kv.head_dim;
    shape.softmax_scale = c.softmax_scale();
    ASSIGN_OR_RETURN(g->sparse_,
                     SparseKvCache::Create(options.sparse, shape, *g->backend_, g->kv_, *g->host_));
  }
  g->dense_attention_ = std::make_unique<DenseKvAttention>(
      *g->backend_, g->kv_, static_cast<int32_t>(c.num_attention_heads), c.softmax_scale());
  g->runner_ = std::make_unique<ModelRunner>(*g->backend_, *g->model_, *g->dense_attention_,
                                             g->sparse_.get(), *g->mask_worker_,
                                             options.cuda_graphs);
  g->prefix_ = std::make_unique<PrefixCache>(options.prefix_cache, g->kv_, g->host_.get());
  // The largest step: every running sequence decodes while a full prefill chunk runs, or one
  // solo chunk runs alone.
  const int64_t largest_step =
      std::max<int64_t>(int64_t{options.prefill_chunk_tokens} + options.max_running,
                        options.solo_prefill_chunk_tokens);
  if (absl::Status s = g->model_->Reserve(largest_step, options.max_running); !s.ok()) {
    return absl::Status(
        s.code(),
        absl::StrFormat("scheduler.prefill_chunk_tokens (%d) + scheduler.max_running_requests "
                        "(%d), or scheduler.solo_prefill_chunk_tokens (%d): the activations of "
                        "the largest step do not fit: %s",
                        options.prefill_chunk_tokens, options.max_running,
                        options.solo_prefill_chunk_tokens, s.message()));
  }
  return g;
}

absl::Status Generator::Validate(const GenerationRequest& r) const {
  const ModelConfig& c = model_->config();
  if (r.prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    if (r.prompt[i] < 0 || r.prompt[i] >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrFormat("prompt_token_ids[%d] = %d is outside the vocabulary [0, %d)", i,
                          r.prompt[i], c.vocab_size));
    }
  }
  RETURN_IF_ERROR(ValidateSamplingParams(r.sampling));
  RETURN_IF_ERROR(ValidateStoppingCriteria(r.stopping, c.vocab_size));
  const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.stopping.max_tokens;
  if (total > c.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "prompt (%d tokens) + stopping.max_tokens (%d) exceeds the model's context of %d tokens",
        r.prompt.size(), r.stopping.max_tokens, c.max_position_embeddings));
  }
  if (r.sparse.budget_tokens < 0 || r.sparse.budget_tokens > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sparse.budget_tokens must be in [0, 2^30], got %d", r.sparse.budget_tokens));
  }
  if (r.sparse.mode == SparseMode::kDense && r.sparse.budget_tokens > 0) {
    return absl::InvalidArgumentError("sparse.budget_tokens is set but sparse.mode is DENSE");
  }
  if (sparse_ == nullptr && (r.sparse.mode == SparseMode::kSparse || r.sparse.budget_tokens > 0)) {
    return absl::FailedPreconditionError(
        "this request asks for the sparse KV cache, but the server runs with "
        "sparse.enabled: false");
  }
  if (UsesSparse(r)) return sparse_->CheckCapacity(total, r.sparse.budget_tokens);
  if (kv_.BlocksFor(total) > kv_.num_blocks()) {
    return NeverFitsError(absl::StrFormat(
        "prompt (%d tokens) + stopping.max_tokens (%d) can never fit: the KV cache holds %d "
        "tokens (kv_cache.capacity_tokens)",
        r.prompt.size(), r.stopping.max_tokens,
        static_cast<int64_t>(kv_.num_blocks()) * kv_.page_size()));
  }
  return absl::OkStatus();
}

int64_t Generator::TotalTokens(const GenerationRequest& r) const {
  return MaxTotalTokens(r, model_->config().max_position_embeddings);
}

bool Generator::UsesSparse(const GenerationRequest& r) const {
  if (sparse_ == nullptr || r.sparse.mode == SparseMode::kDense) return false;
  // A request that names a budget asks for the sparse cache, whatever its length.
  return r.sparse.mode == SparseMode::kSparse || r.sparse.budget_tokens > 0 ||
         TotalTokens(r) >= sparse_->options().effective_min_context_tokens();
}

bool Generator::HasRoomFor(const GenerationRequest& request) const {
  if (static_cast<int32_t>(running_.size()) >= options_.max_running) return false;
  // Preempted sequences come back before anything new starts.
  if (HasPreempted()) return false;
  const int64_t total = TotalTokens(request);
  const bool sparse = UsesSparse(request);
  const PrefixCache::Peek hit = prefix_->PeekHit(sparse, request.prompt, request.session_id);
  // A dense request copies a host hit into blocks of its own: only a pool hit saves blocks.
  const int64_t cached_blocks = sparse || !hit.host ? hit.tokens / kv_.page_size() : 0;
  // A host hit leaves every reclaimable pool block reclaimable.
  const int64_t free_blocks =
      kv_.free_blocks() + (hit.host ? prefix_->reclaimable_blocks() : hit.reclaimable_after);
  if (!sparse) {
    const int64_t now = std::min<int64_t>(total, static_cast<int64_t>(request.prompt.size()) + 1);
    // Beyond what running sequences take at the next step: a new request admitted into their
    // growth would be the youngest, preempted at once.
    return free_blocks >= kv_.BlocksFor(now) - cached_blocks + PendingGrowth();
  }
  const int64_t now = SparseTokensNow(total, static_cast<int64_t>(request.prompt.size()));
  return HasSparseRoom(total, now, request.sparse.budget_tokens, cached_blocks,
                       hit.reclaimable_after, free_blocks);
}

int64_t Generator::SparseTokensNow(int64_t total, int64_t tokens) {
  // Host pages come kSparseGrowthTokens at a time (GrowSparseHostPages): admission takes what
  // the prefill writes plus the first of those, not the whole of max_tokens.
  return std::min(total, tokens + 1 + kSparseGrowthTokens);
}

bool Generator::HasSparseRoom(int64_t total, int64_t now, int64_t budget_tokens,
                              int64_t cached_blocks, int64_t reclaimable_host_pages,
                              int64_t free_blocks) const {
  const HostKvStore& store = *host_;
  const int64_t host_pages =
      (store.PagesFor(now) - cached_blocks) * store.num_layers() * store.num_kv_heads();
  return store.free_pages() + reclaimable_host_pages >= host_pages &&
         free_blocks >= sparse_->Geometry(total, budget_tokens).slots_per_head();
}

int64_t Generator::host_pages_used() const {
  return host_ == nullptr ? 0 : host_->used_pages() - prefix_->evictable_host_pages();
}
int64_t Generator::host_pages_capacity() const {
  return host_ == nullptr ? 0 : host_->capacity_pages();
}
int64_t Generator::device_slots_used() const {
  return sparse_ == nullptr ? 0 : sparse_->device_slots_used();
}

KvStats Generator::FinalKvStats(const Sequence& s) const {
  if (s.sparse_kv() == nullptr) return KvStats();
  return sparse_->Stats(*s.sparse_kv());
}

absl::StatusOr<uint64_t> Generator::Add(GenerationRequest request) {
  RETURN_IF_ERROR(Validate(request));
  if (static_cast<int32_t>(running_.size()) >= options_.max_running) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%d sequences are running already (max_running)", running_.size()));
  }
  if (HasPreempted()) {
    return absl::ResourceExhaustedError(
        "preempted sequences are waiting for KV cache; new ones start after them");
  }
  const uint64_t id = next_id_++;
  auto seq = std::make_unique<Sequence>(id, std::move(request), *tokenizer_, eos_ids_,
                                        model_->config().max_position_embeddings, &masker(),
                                        &mask_caches_);
  RETURN_IF_ERROR(AttachKv(*seq, /*resume=*/false));
  running_.emplace(id, std::move(seq));
  return id;
}

std::vector<int32_t> Generator::TokensOf(const Sequence& seq, int64_t n) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[i] = seq.TokenAt(i);
  return tokens;
}

int64_t Generator::InitialDenseTokens(const Sequence& seq) const {
  // What it runs through the model before sampling, plus the first token it samples: decode
  // grows it a block at a time (GrowDecodeBlocks).
  return std::min(seq.max_total_tokens(), seq.kv_len() + seq.prefill_remaining() + 1);
}

absl::Status Generator::AttachKv(Sequence& seq, bool resume) {
  const GenerationRequest& r = seq.request();
  const bool sparse = seq.sparse_kv() != nullptr || UsesSparse(r);
  if (resume) {
    seq.prefix_hit() = prefix_->Resume(sparse, TokensOf(seq, seq.num_tokens()), r.session_id);
  } else {
    ASSIGN_OR_RETURN(seq.prefix_hit(), prefix_->Begin(sparse, r.prompt, r.session_id));
  }
  std::vector<int32_t> shared;
  prefix_->HitPages(seq.prefix_hit(), &shared);
  const int64_t cached_blocks = seq.prefix_hit().tokens / kv_.page_size();
  const int64_t total = sparse ? seq.max_total_tokens() : InitialDenseTokens(seq);
  // Both kinds take what they need now and grow as they decode (preempted when their pool runs
  // out): a dense sequence its KV-pool blocks, a sparse one its host pages. A sparse sequence's
  // device slots are fixed: its working set is sized for its whole length.
  absl::Status status;
  if (sparse) {
    const HostKvStore& store = *host_;
    const WorkingSetGeometry g = sparse_->Geometry(total, r.sparse.budget_tokens);
    const int64_t now = SparseTokensNow(total, seq.kv_len() + seq.prefill_remaining());
    prefix_->MakeRoom(g.slots_per_head(), (store.PagesFor(now) - cached_blocks) *
                                              store.num_layers() * store.num_kv_heads());
    absl::StatusOr<std::shared_ptr<WorkingSet>> ws = sparse_->Admit(
        total, r.sparse.budget_tokens, static_cast<int64_t>(r.prompt.size()), shared, now);
    if (ws.ok()) seq.set_sparse_kv(*std::move(ws));
    status = ws.status();
  } else {
    status = AttachDenseBlocks(seq, total, std::move(shared));
  }
  if (!status.ok()) {
    prefix_->Finish(
        seq.prefix_hit(), /*kv_valid=*/false, {}, 0,
        [](int64_t) { return absl::Span<const int32_t>(); }, absl::Now());
    return status;
  }
  if (seq.prefix_hit().tokens > 0) seq.SkipCachedPrefix(seq.prefix_hit().tokens);
  if (sparse) {
    // Its prompt is prefilled layer-major; the job holds the prompt's activations and one
    // layer's KV on the device until it is done, so they are had (or refused) now.
    // A resumed sequence prefills its output so far too.
    absl::StatusOr<std::unique_ptr<SparsePrefill>> job = SparsePrefill::Create(
        *model_, *sparse_, *seq.sparse_kv(), resume ? TokensOf(seq, seq.num_tokens()) : r.prompt,
        seq.kv_len(), options_.prefill_chunk_tokens);
    if (!job.ok()) {
      CacheKv(seq, /*kv_valid=*/false);
      sparse_->Release(*seq.sparse_kv());
      seq.set_sparse_kv(nullptr);
      return job.status();
    }
    sparse_prefills_[seq.id()] = std::move(*job);
  }
  return absl::OkStatus();
}

absl::Status Generator::AttachDenseBlocks(Sequence& seq, int64_t total,
                                          std::vector<int32_t> shared) {
  const PrefixHit& hit = seq.prefix_hit();
  if (hit.host) return ReloadFromHost(seq, total, shared);
  const int64_t fresh = kv_.BlocksFor(total) - static_cast<int64_t>(shared.size());
  // The tail's block stays this request's to read until its copy is enqueued, whatever MakeRoom
  // evicts meanwhile.
  kv_.Retain(hit.tail_pages);
  prefix_->MakeRoom(fresh, 0);
  absl::StatusOr<std::vector<int32_t>> blocks = kv_.Allocate(static_cast<int32_t>(fresh));
  if (blocks.ok()) {
    // Copy-on-write: the partly reused block becomes the first block this request writes.
    if (hit.tail_tokens > 0)
      kv_.CopyBlock(backend_->compute_stream(), hit.tail_pages[0], (*blocks)[0]);
    kv_.Retain(shared);
    seq.blocks() = std::move(shared);
    seq.blocks().insert(seq.blocks().end(), blocks->begin(), blocks->end());
  }
  kv_.Free(hit.tail_pages);
  return blocks.status();
}

absl::Status Generator::ReloadFromHost(Sequence& seq, int64_t total,
                                       absl::Span<const int32_t> host_pages) {
  const PrefixHit& hit = seq.prefix_hit();
  const int32_t blocks = kv_.BlocksFor(total);
  // Making room evicts pool blocks only: the hit's pages (locked) and its tail's stay.
  prefix_->MakeRoom(blocks, 0);
  ASSIGN_OR_RETURN(std::vector<int32_t> fresh, kv_.Allocate(blocks));
  const size_t pages_per_block = static_cast<size_t>(host_->num_layers()) * host_->num_kv_heads();
  const size_t whole = host_pages.size() / pages_per_block;
  Stream& stream = backend_->compute_stream();
  kv_.CopyFromHost(stream, host_->pool(), host_pages, absl::MakeConstSpan(fresh).first(whole));
  if (hit.tail_tokens > 0) {
    kv_.CopyFromHost(stream, host_->pool(), hit.tail_pages,
                     absl::MakeConstSpan(fresh).subspan(whole, 1));
  }
  seq.blocks() = std::move(fresh);
  return absl::OkStatus();
}

bool Generator::OffloadToHost(Sequence& seq, absl::Span<const int32_t> tokens, int64_t blocks) {
  std::unique_ptr<PrefixCache::Offload> offload =
      prefix_->BeginOffload(seq.prefix_hit(), tokens, blocks);
  if (offload == nullptr) return false;
  const auto first = static_cast<size_t>(offload->first_block);
  const auto end = static_cast<size_t>(offload->end_block);
  kv_.CopyToHost(backend_->compute_stream(),
                 absl::MakeConstSpan(seq.blocks()).subspan(first, end - first), host_->pool(),
                 offload->block_major);
  if (sparse_ != nullptr) {
    // A later sparse turn of the session scores these pages (a tail it never uses).
    const size_t summarized =
        (static_cast<size_t>(blocks) - first) * host_->num_layers() * host_->num_kv_heads();
    sparse_->SummarizeLater(absl::MakeConstSpan(offload->block_major).first(summarized));
  }
  prefix_->FinishOffload(seq.prefix_hit(), *offload, tokens, blocks, absl::Now());
  return true;
}

void Generator::CacheKv(Sequence& seq, bool kv_valid, bool park) {
  const int32_t ps = kv_.page_size();
  const int64_t blocks = kv_valid ? seq.kv_len() / ps : 0;
  // A dense sequence's partly filled last block is cached too (a tail, copied on reuse); a
  // sparse one's last page is partly on the device only.
  const bool tail = kv_valid && seq.sparse_kv() == nullptr;
  const std::vector<int32_t> tokens = TokensOf(seq, tail ? seq.kv_len() : blocks * ps);
  std::vector<int32_t> block_pages;
  auto pages_of = [&](int64_t block) -> absl::Span<const int32_t> {
    if (seq.sparse_kv() == nullptr) return absl::MakeConstSpan(&seq.blocks()[block], 1);
    block_pages.clear();
    seq.sparse_kv()->host().AppendBlockPages(static_cast<int32_t>(block), &block_pages);
    return block_pages;
  };
  if (park) {
    prefix_->Park(seq.prefix_hit(), tokens, blocks, pages_of);
    return;
  }
  // A dense session's turn leaves its KV in host memory, the pool to running requests.
  if (kv_valid && seq.sparse_kv() == nullptr && OffloadToHost(seq, tokens, blocks)) return;
  prefix_->Finish(seq.prefix_hit(), kv_valid, tokens, blocks, pages_of, absl::Now());
}

void Generator::Preempt(Sequence& seq) {
  // A sparse prompt mid-prefill has layers half written: only decoding sparse sequences are
  // preempted. Their whole pages are complete (written back when they filled, on the compute
  // stream, before the last step's synchronization); a dense sequence's KV is complete up to
  // kv_len, in prefill or not.
  CHECK(seq.sparse_kv() == nullptr || !seq.in_prefill())
      << "a sparse sequence is preempted while it decodes";
  CacheKv(seq, /*kv_valid=*/true, /*park=*/true);
  if (seq.sparse_kv() != nullptr) {
    sparse_->Release(*seq.sparse_kv());
    seq.set_sparse_kv(nullptr);
  } else {
    kv_.Free(seq.blocks());
  }
  seq.Preempt();
  ++preemptions_;
}

bool Generator::HasPreempted() const {
  return std::any_of(running_.begin(), running_.end(),
                     [](const auto& e) { return e.second->preempted(); });
}

void Generator::ResumePreempted(std::vector<SequenceOutput>* outputs) {
  // Oldest first, and none behind one that does not fit: the oldest is never passed over.
  for (auto it = running_.begin(); it != running_.end();) {
    Sequence& s = *it->second;
    if (!s.preempted()) {
      ++it;
      continue;
    }
    if (!HasRoomToResume(s)) return;
    if (absl::Status attached = AttachKv(s, /*resume=*/true); !attached.ok()) {
      // Room was there, so this is an allocation failure (a device buffer, an injected fault):
      // the sequence fails alone. AttachKv has given back what it took and closed its hit.
      outputs->push_back(FailedOutput(
          s, absl::Status(attached.code(),
                          absl::StrCat("resuming after preemption: ", attached.message()))));
      it = running_.erase(it);
      continue;
    }
    resumed_cached_tokens_ += s.kv_len();
    s.set_preempted(false);
    ++it;
  }
}

bool Generator::HasRoomToResume(const Sequence& s) const {
  const bool sparse = UsesSparse(s.request());
  const PrefixCache::Peek hit = prefix_->PeekHit(sparse, TokensOf(s, s.num_tokens()),
                                                 s.request().session_id, /*always=*/true);
  const int64_t cached_blocks = hit.tokens / kv_.page_size();
  // Room beyond what running sequences take this step, or it would be preempted again at once.
  if (sparse) {
    const int64_t total = s.max_total_tokens();
    return HasSparseRoom(total, SparseTokensNow(total, s.num_tokens()),
                         s.request().sparse.budget_tokens, cached_blocks,
                         hit.reclaimable_after - SparseGrowthPages(),
                         kv_.free_blocks() + prefix_->reclaimable_blocks() - PendingGrowth());
  }
  if (hit.host) {  // copied into blocks of its own
    return kv_.free_blocks() + prefix_->reclaimable_blocks() >=
           kv_.BlocksFor(InitialDenseTokens(s)) + PendingGrowth();
  }
  const int64_t need = kv_.BlocksFor(InitialDenseTokens(s)) - cached_blocks + PendingGrowth();
  return kv_.free_blocks() + hit.reclaimable_after >= need;
}

bool Generator::NeedsBlock(const Sequence& s) const {
  return !s.preempted() && s.sparse_kv() == nullptr && !s.in_prefill() &&
         s.kv_len() / kv_.page_size() >= static_cast<int64_t>(s.blocks().size());
}

int64_t Generator::PendingGrowth() const {
  return std::count_if(running_.begin(), running_.end(),
                       [&](const auto& e) { return NeedsBlock(*e.second); });
}

void Generator::GrowDecodeBlocks() {
  auto active_dense = [](const Sequence& s) { return !s.preempted() && s.sparse_kv() == nullptr; };
  std::vector<Sequence*> growing;  // decoding into a position past their last block
  for (auto& [id, s] : running_) {
    if (NeedsBlock(*s)) growing.push_back(s.get());
  }
  if (growing.empty()) return;
  prefix_->MakeRoom(static_cast<int64_t>(growing.size()), 0);
  // Out of blocks: the youngest running sequences give theirs back (parked in the prefix cache
  // while nothing else needs the room) until the others can grow.
  for (auto it = running_.rbegin();
       kv_.free_blocks() < static_cast<int32_t>(growing.size()) && it != running_.rend(); ++it) {
    Sequence& victim = *it->second;
    if (!active_dense(victim)) continue;
    Preempt(victim);
    growing.erase(std::remove(growing.begin(), growing.end(), &victim), growing.end());
    prefix_->MakeRoom(static_cast<int64_t>(growing.size()), 0);
  }
  for (Sequence* s : growing) s->blocks().push_back(kv_.Allocate(1).value().front());
}

bool Generator::NeedsHostPages(const Sequence& s) const {
  return !s.preempted() && s.sparse_kv() != nullptr && !s.in_prefill() &&
         s.kv_len() + 1 > s.sparse_kv()->host().allocated_tokens();
}

int64_t Generator::SparseGrowthTarget(const Sequence& s) const {
  return SparseTokensNow(s.max_total_tokens(), s.kv_len());
}

int64_t Generator::SparseGrowthPages() const {
  if (sparse_ == nullptr) return 0;
  const HostKvStore& store = *host_;
  int64_t pages = 0;
  for (const auto& [id, s] : running_) {
    if (!NeedsHostPages(*s)) continue;
    pages += (store.PagesFor(SparseGrowthTarget(*s)) -
              s->sparse_kv()->host().allocated_pages_per_head()) *
             store.num_layers() * store.num_kv_heads();
  }
  return pages;
}

void Generator::GrowSparseHostPages(std::vector<SequenceOutput>* outputs) {
  int64_t needed = SparseGrowthPages();
  if (needed == 0) return;
  const HostKvStore& store = *host_;
  prefix_->MakeRoom(0, needed);
  // Out of host pages: the youngest decoding sparse sequences give theirs back (parked in the
  // sparse prefix index while nothing else needs the room) until the others can grow.
  for (auto it = running_.rbegin(); store.free_pages() < needed && it != running_.rend(); ++it) {
    Sequence& victim = *it->second;
    if (victim.preempted() || victim.sparse_kv() == nullptr || victim.in_prefill()) continue;
    Preempt(victim);
    needed = SparseGrowthPages();  // the victim may have been one of those growing
    prefix_->MakeRoom(0, needed);
  }
  std::vector<uint64_t> failed;
  for (auto& [id, s] : running_) {
    if (!NeedsHostPages(*s)) continue;
    if (absl::Status grown = sparse_->Grow(*s->sparse_kv(), SparseGrowthTarget(*s)); !grown.ok()) {
      // Not a lack of room (made above): an allocation failure.
      outputs->push_back(FailedOutput(*s, std::move(grown)));
      failed.push_back(id);
    }
  }
  for (uint64_t id : failed) Retire(id, /*kv_valid=*/false);
}

int64_t Generator::CachedPromptTokens(uint64_t id) const {
  auto it = running_.find(id);
  CHECK(it != running_.end());
  return it->second->cached_prompt_tokens();
}

void Generator::Retire(uint64_t id, bool kv_valid) {
  auto it = running_.find(id);
  CHECK(it != running_.end());
  Sequence& seq = *it->second;
  if (seq.sparse_kv() != nullptr) {
    sparse_prefills_.erase(id);
    // Its pages' write-backs ran on the compute stream before the last step's synchronization,
    // so the pages the cache takes are complete.
    CacheKv(seq, kv_valid);
    sparse_->Release(*seq.sparse_kv());
  } else {
    CacheKv(seq, kv_valid);
    kv_.Free(seq.blocks());
  }
  running_.erase(it);
}

absl::Status Generator::Cancel(uint64_t id, SequenceOutput* out, bool kv_valid) {
  auto it = running_.find(id);
  if (it == running_.end()) {
    return absl::NotFoundError(absl::StrFormat("no running sequence %d", id));
  }
  out->id = id;
  it->second->Finish(FinishReason::kCancelled, out);
  out->kv_stats = FinalKvStats(*it->second);
  Retire(id, kv_valid);
  return absl::OkStatus();
}

absl::Status Generator::Step(std::vector<SequenceOutput>* outputs) {
  last_step_ = StepStats();
  if (running_.empty()) return absl::OkStatus();
  if (!backend_->device_fault().ok()) return backend_->device_fault();
  if (SPECULA_FAULT(Fault::kEngineStep)) return absl::InternalError("step failed (injected fault)");
  (void)SPECULA_FAULT(Fault::kStallStep);  // sleeps when armed
  ResumePreempted(outputs);
  GrowDecodeBlocks();
  GrowSparseHostPages(outputs);
  if (running_.empty()) return absl::OkStatus();
  runner_->plan().Clear();
  if (sparse_ != nullptr) sparse_->PlanStep(runner_->plan());
  ScheduledStep& step = ChooseRows();
  if (step.rows.empty()) return absl::OkStatus();  // every sequence waits for room
  RETURN_IF_ERROR(runner_->Plan(step));
  runner_->Run(step);
  return FinishStep(step, outputs);
}

int64_t Generator::PrefillBudget() const {
  for (const auto& [id, s] : running_) {
    if (!s->preempted() && !s->in_prefill()) return options_.prefill_chunk_tokens;
  }
  return options_.solo_prefill_chunk_tokens > 0 ? options_.solo_prefill_chunk_tokens
                                                : options_.prefill_chunk_tokens;
}

ScheduledStep& Generator::ChooseRows() {
  ScheduledStep& step = step_;
  step.Clear();
  int64_t prefill_budget = PrefillBudget();
  // Decode first: every running sequence gets its token each step, so TBT stays bounded while
  // long prompts are prefilled a chunk at a time. Prefills in admission order within the
  // budget; a sparse one (layer-major, engine/generate/sparse_prefill.h) takes what is left of
  // it, times the layer count, in (layer, chunk) units.
  std::vector<std::pair<Sequence*, int64_t>>& dense_prefills = dense_prefills_;
  dense_prefills.clear();
  for (auto& [id, s] : running_) {
    if (prefill_budget == 0) break;
    if (!s->in_prefill() || s->preempted()) continue;
    if (s->sparse_kv() != nullptr) {
      if (step.sparse_prefill != nullptr) continue;  // one layer-major prefill at a time
      step.sparse_prefill = sparse_prefills_.at(id).get();
      step.sparse_prefill_seq = s.get();
      step.sparse_layer_tokens = prefill_budget * model_->config().num_hidden_layers;
      prefill_budget = 0;
      continue;
    }
    const int64_t n = std::min(prefill_budget, s->prefill_remaining());
    dense_prefills.emplace_back(s.get(), n);
    prefill_budget -= n;
  }
  auto add_row = [&](Sequence* s, int64_t n, bool prefill) {
    const bool sample = !prefill || n == s->prefill_remaining();
    const auto q_begin = static_cast<int32_t>(step.tokens.size());
    const int64_t start = s->kv_len();
    for (int64_t i = 0; i < n; ++i) {
      step.tokens.push_back(s->TokenAt(start + i));
      step.positions.push_back(static_cast<int32_t>(start + i));
    }
    if (s->sparse_kv() != nullptr) {
      step.sparse_decode.push_back({s->sparse_kv().get(), q_begin, static_cast<int32_t>(start)});
    } else {
      const auto kv_len = static_cast<int32_t>(start + n);
      step.dense.push_back({q_begin, static_cast<int32_t>(n), kv_len,
                            absl::MakeConstSpan(s->blocks()).subspan(0, kv_.BlocksFor(kv_len))});
    }
    if (sample) step.logit_rows.push_back(q_begin + static_cast<int32_t>(n) - 1);
    step.rows.push_back({s, n, prefill, sample});
  };
  for (auto& [id, s] : running_) {
    if (!s->preempted() && !s->in_prefill() && s->sparse_kv() == nullptr)
      add_row(s.get(), 1, false);
  }
  for (auto& [s, n] : dense_prefills) add_row(s, n, true);
  for (auto& [id, s] : running_) {
    if (!s->preempted() && !s->in_prefill() && s->sparse_kv() != nullptr)
      add_row(s.get(), 1, false);
  }
  if (step.sparse_prefill != nullptr) {
    step.rows.push_back({step.sparse_prefill_seq, 0, true, false});
  }
  return step;
}

absl::Status Generator::FinishStep(const ScheduledStep& step,
                                   std::vector<SequenceOutput>* outputs) {
  if (sparse_ != nullptr) sparse_->EndStep();
  if (step.sparse_prefill != nullptr) step.sparse_prefill->EndStep();
  Stopwatch wait;
  runner_->ReadResults();
  last_step_.device_wait_seconds = wait.Lap();
  // What was read back is not to be trusted; the engine fails every request and stops.
  if (!backend_->device_fault().ok()) return backend_->device_fault();
  last_step_.sampled_on_device = runner_->sampled_on_device();
  last_step_.replayed = runner_->replayed();
  if (sparse_ != nullptr) sparse_->FinishStep(&last_step_.sparse);
  if (step.sparse_prefill != nullptr) step.sparse_prefill->FinishStep(&last_step_.sparse);

  const absl::flat_hash_set<uint64_t> copy_failed = FailSparseOnCopyError(outputs);
  size_t sampled = 0;
  std::vector<uint64_t> done, failed(copy_failed.begin(), copy_failed.end());
  for (const ScheduledRow& p : step.rows) {
    if (copy_failed.contains(p.seq->id())) {
      if (p.sample) ++sampled;
      continue;
    }
    if (p.prefill) {
      last_step_.prefill_tokens += static_cast<int32_t>(p.n);
    } else {
      ++last_step_.decode_rows;
    }
    if (p.seq->sparse_kv() != nullptr && p.prefill) {
      if (!p.sample) continue;  // the layer-major prefill goes on
      const int64_t suffix = p.seq->prefill_remaining();
      last_step_.prefill_tokens += static_cast<int32_t>(suffix);
      sparse_prefills_.erase(p.seq->id());
      p.seq->AdvanceKv(suffix, true);
    } else {
      p.seq->AdvanceKv(p.n, p.prefill);
    }
    if (!p.sample) continue;
    SequenceOutput out;
    out.id = p.seq->id();
    if (absl::Status s = runner_->Accept(sampled++, *p.seq, &out); !s.ok()) {
      // Only this sequence's activations are poisoned (its own tokens, its own KV): it fails
      // alone, and its KV is never reused.
      outputs->push_back(FailedOutput(*p.seq, std::move(s)));
      failed.push_back(p.seq->id());
      continue;
    }
    if (out.finish != FinishReason::kNone) out.kv_stats = FinalKvStats(*p.seq);
    if (out.finish != FinishReason::kNone) done.push_back(out.id);
    outputs->push_back(std::move(out));
  }
  for (uint64_t id : done) Retire(id);
  for (uint64_t id : failed) Retire(id, /*kv_valid=*/false);
  return absl::OkStatus();
}

absl::flat_hash_set<uint64_t> Generator::FailSparseOnCopyError(
    std::vector<SequenceOutput>* outputs) {
  absl::flat_hash_set<uint64_t> failed;
  if (sparse_ == nullptr) return failed;
  const absl::Status copy = sparse_->prefetcher().TakeCopyError();
  if (copy.ok()) return failed;
  // Gathers are batched across the step's sequences, and a failed one may leave any of their
  // cache slots loading forever: every sparse sequence that could have had pages in it fails,
  // with its KV discarded. Dense sequences (no copy streams) and later requests are untouched.
  for (auto& [id, s] : running_) {
    if (s->sparse_kv() == nullptr) continue;
    outputs->push_back(FailedOutput(
        *s, absl::InternalError(absl::StrCat("a prefetch copy of this request's KV pages failed (",
                                             copy.message(), "); its KV cache was discarded"))));
    failed.insert(id);
  }
  return failed;
}

SequenceOutput Generator::FailedOutput(const Sequence& s, absl::Status error) const {
  SequenceOutput out;
  out.id = s.id();
  out.error = std::move(error);
  out.kv_stats = FinalKvStats(s);
  return out;
}

absl::StatusOr<std::vector<GenerationResult>> Generator::GenerateAll(
    std::vector<GenerationRequest> reqs) {
  for (const auto& r : reqs) RETURN_IF_ERROR(Validate(r));
  std::vector<GenerationResult> results(reqs.size());
  std::map<uint64_t, size_t> index;  // sequence id -> request index
  std::deque<size_t> waiting;
  for (size_t i = 0; i < reqs.size(); ++i) waiting.push_back(i);
  std::vector<SequenceOutput> outputs;
  // On failure, retire what this call admitted so nothing keeps KV behind the caller's back.
  auto fail = [&](absl::Status s) {
    SequenceOutput ignored;
    for (const auto& [id, i] : index) {
      if (running_.contains(id)) Cancel(id, &ignored).IgnoreError();
    }
    return s;
  };
  auto own_running = [&] {
    for (const auto& [id, i] : index) {
      if (running_.contains(id)) return true;
    }
    return false;
  };
  while (!waiting.empty() || own_running()) {
    while (!waiting.empty()) {
      auto id = Add(reqs[waiting.front()]);
      if (absl::IsResourceExhausted(id.status()) && HasWork()) break;  // wait for room
      if (!id.ok()) return fail(id.status());
      index[*id] = waiting.front();
      waiting.pop_front();
    }
    outputs.clear();
    if (absl::Status s = Step(&outputs); !s.ok()) return fail(s);
    for (SequenceOutput& o : outputs) {
      auto it = index.find(o.id);
      if (it == index.end()) continue;  // a sequence the caller added itself
      if (!o.error.ok()) return fail(o.error);
      GenerationResult& r = results[it->second];
      r.tokens.insert(r.tokens.end(), o.tokens.begin(), o.tokens.end());
      r.text += o.text;
      r.logprobs.insert(r.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
      r.finish = o.finish;
    }
  }
  return results;
}

}  // namespace specula
