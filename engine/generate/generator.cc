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
#include "engine/common/stopwatch.h"
#include "engine/kv/kv_dtype.h"
#include "engine/kv/sparse_decode.h"

namespace specula {

namespace {

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

// The longest a grammar's preparation runs (MaskPreparer): its first request waits for it in the
// queue. A new string shape costs ~50-90 ms at a 128K vocabulary on one core (once per process);
// what is not reached by then is built by the steps, as without preparation.
constexpr std::chrono::milliseconds kMaskPrepareBudget{2000};

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
  backend.dependent_launches = options.dependent_launches;
  Stopwatch clock;
  ASSIGN_OR_RETURN(g->backend_, CreateBackend(backend));
  g->load_timings_.backend_seconds = clock.Lap();
  ASSIGN_OR_RETURN(g->model_, Transformer::Load(model_dir, *g->backend_));
  g->load_timings_.weights_seconds = clock.Lap();
  RETURN_IF_ERROR(g->LoadTokenizer(model_dir));
  clock.Lap();  // the tokenizer and generation config are not the KV's time
  RETURN_IF_ERROR(g->CreateKv());
  g->load_timings_.kv_seconds = clock.Lap();
  g->CreateScheduling();
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

absl::Status Generator::LoadTokenizer(const std::string& model_dir) {
  // The model's vocabulary bounds the tokenizer's ids before anything is sized by them.
  const ModelConfig& c = model_->config();
  ASSIGN_OR_RETURN(tokenizer_, Tokenizer::FromDirectory(model_dir, c.vocab_size));
  ASSIGN_OR_RETURN(GenerationConfig gen, LoadGenerationConfig(model_dir));
  if (tokenizer_->vocab_size() > c.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: tokenizer has %d ids but config.json vocab_size is %d", model_dir,
                        tokenizer_->vocab_size(), c.vocab_size));
  }
  for (int64_t id : gen.eos_token_ids) eos_ids_.insert(static_cast<int32_t>(id));
  for (int64_t id : c.eos_token_ids) eos_ids_.insert(static_cast<int32_t>(id));
  if (auto eos = tokenizer_->eos_token_id()) eos_ids_.insert(*eos);
  token_table_ = std::make_unique<grammar::TokenTable>(GrammarTokenTable(*tokenizer_));
  shared_mask_entries_ = std::make_unique<grammar::SharedMaskEntries>();
  // Half the cores, at most 8: an entry takes ~50-100 ms on one core at a 128K vocabulary. The
  // threads start with the first constrained request's first entry.
  const int mask_threads =
      std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 2, 1, 8);
  masker_ = std::make_unique<grammar::TokenMasker>(
      *token_table_,
      grammar::TokenMaskerOptions{.threads = mask_threads, .shared = shared_mask_entries_.get()});
  // Half the masker's threads: on the CPU backend they share the cores with the running batch.
  mask_preparer_ =
      std::make_unique<MaskPreparer>(*token_table_, shared_mask_entries_.get(), mask_caches_,
                                     std::max(1, mask_threads / 2), kMaskPrepareBudget);
  mask_worker_ = std::make_unique<MaskWorker>(*masker_);
  return absl::OkStatus();
}

absl::Status Generator::CreateKv() {
  const ModelConfig& c = model_->config();
  KvPoolOptions kv;
  kv.num_layers = static_cast<int32_t>(c.num_hidden_layers);
  kv.num_kv_heads = static_cast<int32_t>(c.num_key_value_heads);
  kv.head_dim = static_cast<int32_t>(c.head_dim);
  kv.page_size = options_.page_size;
  kv.num_blocks = static_cast<int32_t>(options_.kv_cache_tokens / options_.page_size);
  absl::StatusOr<DType> kv_dtype = ResolveKvDtype(options_.kv_dtype, backend_->default_kv_dtype());
  if (!kv_dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_cache.dtype: ", kv_dtype.status().message()));
  }
  kv.dtype = *kv_dtype;
  absl::StatusOr<KvPool> pool = KvPool::Create(*backend_, kv);
  if (!pool.ok()) {
    return absl::Status(pool.status().code(),
                        absl::StrFormat("kv_cache.capacity_tokens: %d tokens of KV cache for this "
                                        "model do not fit: %s",
                                        options_.kv_cache_tokens, pool.status().message()));
  }
  kv_ = *std::move(pool);
  ASSIGN_OR_RETURN(host_, CreateHostStore(options_, kv_, *backend_));
  // options() reports the policy that runs (or would, with sparse off), as SparseKvCache does.
  options_.sparse.miss_policy =
      ResolveMissPolicy(options_.sparse.miss_policy, backend_->memory_is_host_readable());
  if (options_.sparse.enabled) {
    SparseModelShape shape;
    shape.layers = kv.num_layers;
    shape.heads = static_cast<int32_t>(c.num_attention_heads);
    shape.kv_heads = kv.num_kv_heads;
    shape.head_dim = kv.head_dim;
    shape.softmax_scale = c.softmax_scale();
    ASSIGN_OR_RETURN(sparse_,
                     SparseKvCache::Create(options_.sparse, shape, *backend_, kv_, *host_));
  }
  prefix_ = std::make_unique<PrefixCache>(options_.prefix_cache, kv_, host_.get());
  return absl::OkStatus();
}

void Generator::CreateScheduling() {
  const ModelConfig& c = model_->config();
  dense_attention_ = std::make_unique<DenseKvAttention>(
      *backend_, kv_, static_cast<int32_t>(c.num_attention_heads), c.softmax_scale());
  runner_ = std::make_unique<ModelRunner>(*backend_, *model_, *dense_attention_, sparse_.get(),
                                          *mask_worker_, options_.cuda_graphs);
  const KvResources resources{*backend_, kv_, host_.get(), *prefix_};
  dense_kv_ = std::make_unique<DenseKvManager>(resources, sparse_.get());
  // The runner lays out dense rows first.
  std::vector<KvManager*> managers = {dense_kv_.get()};
  if (sparse_ != nullptr) {
    sparse_kv_ = std::make_unique<SparseKvManager>(resources, *sparse_, *model_,
                                                   options_.prefill_chunk_tokens);
    managers.push_back(sparse_kv_.get());
  }
  Scheduler::Options scheduling;
  scheduling.max_running = options_.max_running;
  scheduling.prefill_chunk_tokens = options_.prefill_chunk_tokens;
  scheduling.solo_prefill_chunk_tokens = options_.solo_prefill_chunk_tokens;
  scheduler_ = std::make_unique<Scheduler>(scheduling, std::move(managers));
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

KvManager& Generator::KvFor(const GenerationRequest& request) const {
  if (UsesSparse(request)) return *sparse_kv_;
  return *dense_kv_;
}

bool Generator::HasRoomFor(const GenerationRequest& request) const {
  return scheduler_->HasRoomFor(request, TotalTokens(request), KvFor(request));
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

void Generator::PrepareMasks(const GenerationRequest& request) {
  mask_preparer_->Request(request.constraint.grammar, /*awaited=*/true);
  mask_preparer_->Request(request.constraint.triggered, /*awaited=*/false);
}

bool Generator::MasksReady(const GenerationRequest& request) const {
  // Only the grammar that holds from the first token: a triggered one (a strict tool call the
  // model opens) is needed later, most often after its preparation is done.
  const grammar::Grammar* g = request.constraint.grammar.get();
  return g == nullptr || !mask_caches_.Preparing(g);
}

absl::StatusOr<uint64_t> Generator::Add(GenerationRequest request) {
  RETURN_IF_ERROR(Validate(request));
  RETURN_IF_ERROR(scheduler_->CheckAdmission());
  KvManager& kv = KvFor(request);
  const uint64_t id = next_id_++;
  RETURN_IF_ERROR(
      scheduler_->Admit(std::make_unique<Sequence>(id, std::move(request), *tokenizer_, eos_ids_,
                                                   model_->config().max_position_embeddings,
                                                   masker_.get(), &mask_caches_),
                        kv));
  return id;
}

int64_t Generator::CachedPromptTokens(uint64_t id) const {
  const Sequence* seq = scheduler_->Find(id);
  CHECK(seq != nullptr);
  return seq->cached_prompt_tokens();
}

absl::Status Generator::Cancel(uint64_t id, SequenceOutput* out, bool kv_valid) {
  Sequence* seq = scheduler_->Find(id);
  if (seq == nullptr) return absl::NotFoundError(absl::StrFormat("no running sequence %d", id));
  out->id = id;
  seq->Finish(FinishReason::kCancelled, out);
  out->kv_stats = scheduler_->FinalKvStats(*seq);
  scheduler_->Retire(id, kv_valid);
  return absl::OkStatus();
}

absl::Status Generator::Step(std::vector<SequenceOutput>* outputs) {
  last_step_.Reset();
  if (scheduler_->empty()) return absl::OkStatus();
  if (!backend_->device_fault().ok()) return backend_->device_fault();
  if (SPECULA_FAULT(Fault::kEngineStep)) return absl::InternalError("step failed (injected fault)");
  (void)SPECULA_FAULT(Fault::kStallStep);  // sleeps when armed
  scheduler_->MakeRoom(outputs);
  if (scheduler_->empty()) return absl::OkStatus();
  runner_->plan().Clear();
  scheduler_->PlanKv(runner_->plan());
  ScheduledStep& step = scheduler_->ChooseRows();
  if (step.rows.empty()) return absl::OkStatus();  // every sequence waits for room
  RETURN_IF_ERROR(runner_->Plan(step));
  runner_->Run(step);
  return FinishStep(step, outputs);
}

absl::Status Generator::FinishStep(const ScheduledStep& step,
                                   std::vector<SequenceOutput>* outputs) {
  scheduler_->EndKvStep(step);
  Stopwatch wait;
  runner_->ReadResults();
  last_step_.device_wait_seconds = wait.Lap();
  // What was read back is not to be trusted; the engine fails every request and stops.
  if (!backend_->device_fault().ok()) return backend_->device_fault();
  last_step_.sampled_on_device = runner_->sampled_on_device();
  last_step_.replayed = runner_->replayed();
  scheduler_->FinishKvStep(step, &last_step_.sparse);

  const absl::flat_hash_set<uint64_t> kv_failed = scheduler_->FailOnStepErrors(outputs);
  size_t sampled = 0;
  std::vector<uint64_t> done, failed(kv_failed.begin(), kv_failed.end());
  for (const ScheduledRow& p : step.rows) {
    if (p.prefill) ++last_step_.prefill_rows;  // the device ran it, whatever became of it
    if (kv_failed.contains(p.seq->id())) {
      if (p.sample) ++sampled;
      continue;
    }
    const int64_t written = scheduler_->Advance(p);
    if (p.prefill) {
      last_step_.prefill_tokens += static_cast<int32_t>(written);
    } else {
      ++last_step_.decode_rows;
    }
    if (!p.sample) continue;
    SequenceOutput out;
    out.id = p.seq->id();
    if (absl::Status s = runner_->Accept(sampled++, *p.seq, &out); !s.ok()) {
      // Only this sequence's activations are poisoned (its own tokens, its own KV): it fails
      // alone, and its KV is never reused.
      outputs->push_back(scheduler_->FailedOutput(*p.seq, std::move(s)));
      failed.push_back(p.seq->id());
      continue;
    }
    if (out.finish != FinishReason::kNone) {
      out.kv_stats = scheduler_->FinalKvStats(*p.seq);
      done.push_back(out.id);
    }
    outputs->push_back(std::move(out));
  }
  for (uint64_t id : done) scheduler_->Retire(id);
  for (uint64_t id : failed) scheduler_->Retire(id, /*kv_valid=*/false);
  return absl::OkStatus();
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
      if (scheduler_->Find(id) != nullptr) Cancel(id, &ignored).IgnoreError();
    }
    return s;
  };
  auto own_running = [&] {
    for (const auto& [id, i] : index) {
      if (scheduler_->Find(id) != nullptr) return true;
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
