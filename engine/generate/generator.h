// The engine core: a model, its tokenizer, a KV pool and the running sequences, advanced one
// batched step at a time (chunked prefill and decode mixed in one forward pass).
//
// Single-threaded: every method is called from the engine thread (the server's scheduler, the
// offline CLI or a test). Cross-thread queues live one level up.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/backend/backend.h"
#include "engine/common/device_kind.h"
#include "engine/generate/dense_kv_manager.h"
#include "engine/generate/mask_preparer.h"
#include "engine/generate/model_runner.h"
#include "engine/generate/scheduler.h"
#include "engine/generate/sequence.h"
#include "engine/generate/sparse_kv_manager.h"
#include "engine/grammar/shared_mask_entries.h"
#include "engine/kv/dense_attention.h"
#include "engine/kv/kv_pool.h"
#include "engine/kv/prefix_cache.h"
#include "engine/kv/sparse_kv_cache.h"
#include "engine/model/model_config.h"
#include "engine/model/transformer.h"
#include "engine/tokenizer/tokenizer.h"

namespace specula {

// Each option is a key of the server's configuration (kv_cache.*, scheduler.*, sparse.*); errors
// that an option causes name that key, so the operator knows which one to change.
struct GeneratorOptions {
  int32_t page_size = 16;
  int64_t kv_cache_tokens = 65536;     // capacity of the KV pool, in token positions
  std::string kv_dtype = "auto";       // kv_cache.dtype: auto | bf16 | f16 | f32 (ResolveKvDtype)
  int32_t prefill_chunk_tokens = 512;  // most prompt tokens per step (over all sequences)
  // Most prompt tokens per step when no sequence is decoding (no time between tokens to keep
  // short): long prompts then take larger chunks. 0: prefill_chunk_tokens.
  int32_t solo_prefill_chunk_tokens = 0;
  int32_t max_running = 64;  // most sequences in one step
  int32_t threads = 0;       // CPU threads, 0 = all cores
  // model.device (CreateBackend). The engine defaults to the CPU, deterministic for embedders and
  // tests; the server reads the key (default auto) and always sets it.
  DeviceKind device = DeviceKind::kCpu;
  // model.cuda_graphs: decode steps recorded once and replayed as one launch where the backend
  // can record (a GPU); false runs every operation as it is enqueued.
  bool cuda_graphs = true;
  // model.dependent_launches (BackendOptions).
  bool dependent_launches = true;
  // KV reuse across requests: sessions always; requests without a session when
  // prefix_cache.cache_sessionless (kv_cache.prefix_cache).
  PrefixCacheOptions prefix_cache;
  SparseOptions sparse;  // sparse KV cache with host backing (docs/ARCHITECTURE.md §4)
  // kv_cache.host_capacity_tokens: the host KV store, in token positions per layer and KV head.
  // It holds sparse requests' KV and the KV of sessions between turns (docs/SESSIONS.md).
  // -1: kDefaultHostCapacityTokens with sparse.enabled, else none (dense sessions stay in the
  // KV pool). 0: none (sparse.enabled needs one).
  int64_t host_capacity_tokens = -1;
  static constexpr int64_t kDefaultHostCapacityTokens = 262144;
  int64_t effective_host_capacity_tokens() const {
    if (host_capacity_tokens >= 0) return host_capacity_tokens;
    return sparse.enabled ? kDefaultHostCapacityTokens : 0;
  }
};

// What the last Step() did.
struct StepStats {
  int32_t decode_rows = 0;     // sequences that decoded one token
  int32_t prefill_tokens = 0;  // prompt tokens run through the model
  // Sequences whose prompt ran in this step, failed ones included: a chunk, or a layer-major
  // prefill's units (whose tokens count in prefill_tokens only when its last unit ends the
  // prompt), or a preempted sequence's catch-up.
  int32_t prefill_rows = 0;
  // Whether the step's tokens were sampled on the backend (only tokens read back) rather than
  // from logits read back to the host (a row with a penalty); false when nothing sampled.
  bool sampled_on_device = false;
  bool replayed = false;  // the step replayed a recorded one (model.cuda_graphs)
  // Seconds the engine thread waited for the backend at the step's one synchronization (the
  // readback): the step's wall time less this is host work, during which the device may idle.
  double device_wait_seconds = 0;
  SparseStepStats sparse;  // what the sparse KV cache did in this step

  // Zero for the next step, keeping the latency samples' room (a steady step allocates nothing).
  void Reset() {
    std::vector<double> latencies = std::move(sparse.prefetch_latencies_seconds);
    latencies.clear();
    *this = StepStats();
    sparse.prefetch_latencies_seconds = std::move(latencies);
  }
};

struct GenerationResult {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<SampledToken> logprobs;
  FinishReason finish = FinishReason::kNone;
};

class Generator {
 public:
  // Loads the model directory (config, weights, tokenizer, generation config) on the backend
  // options.device names (CreateBackend; its errors start with "model.device: ").
  static absl::StatusOr<std::unique_ptr<Generator>> Create(const std::string& model_dir,
                                                           const GeneratorOptions& options);

  const ModelConfig& model_config() const { return model_->config(); }
  const Transformer& model() const { return *model_; }
  // Where Create's time went: the model_loaded log line reports each.
  struct LoadTimings {
    double backend_seconds = 0;  // creating the backend (CUDA initialisation on a GPU)
    double weights_seconds = 0;  // config.json and the weights, read and placed on the backend
    double kv_seconds = 0;       // the KV pool and the host store (pinning it, on a GPU)
  };
  const LoadTimings& load_timings() const { return load_timings_; }
  // The backend's name ("cpu"), as model.device resolved to.
  std::string backend_name() const { return backend_->name(); }
  // The backend's synchronization and readback counts (tests, benchmarks).
  const BackendCounters& backend_counters() const { return backend_->counters(); }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const GeneratorOptions& options() const { return options_; }
  const absl::flat_hash_set<int32_t>& eos_ids() const { return eos_ids_; }
  const KvPool& kv_pool() const { return kv_; }
  // The KV pages' dtype, as kv_cache.dtype resolved on this backend.
  DType kv_dtype() const { return kv_.dtype(); }
  // KV-pool blocks held by running requests and sessions (cached blocks nothing holds are free
  // for admission and not counted), and those cached blocks.
  int64_t kv_blocks_used() const { return kv_.used_blocks() - prefix_->evictable_blocks(); }
  int64_t kv_blocks_cached() const { return prefix_->evictable_blocks(); }
  // Sparse KV accounting; all 0 when sparse.enabled is false. Host pages count one page per
  // (layer, KV head), held by running requests and sessions (cached pages nothing holds are
  // host_pages_cached); device slots are pages of the KV pool held by sparse working sets.
  int64_t host_pages_used() const;
  int64_t host_pages_cached() const { return prefix_->evictable_host_pages(); }
  int64_t host_pages_capacity() const;
  int64_t device_slots_used() const;
  // The host KV store (null without kv_cache.host_capacity_tokens).
  const HostKvStore* host_store() const { return host_.get(); }
  // The sparse cache (null unless sparse.enabled), for benchmarks' probes.
  SparseKvCache* sparse_cache() { return sparse_.get(); }
  // Whether `request` would run on the sparse cache: sparse.mode SPARSE, or DEFAULT with a
  // budget_tokens set or prompt + max_tokens >= sparse.min_context_tokens.
  bool UsesSparse(const GenerationRequest& request) const;

  // Checks a request against the model (ids, lengths, sampling values) without admitting it.
  // A request larger than the KV cache or host store could ever hold is RESOURCE_EXHAUSTED
  // marked never-fits (engine/common/capacity_error.h), not "full now".
  absl::Status Validate(const GenerationRequest& request) const;
  // Admits a request and reserves its KV for prompt + max_tokens: RESOURCE_EXHAUSTED when the
  // pool cannot hold it now, or when max_running sequences run already.
  absl::StatusOr<uint64_t> Add(GenerationRequest request);
  // Whether Add would admit `request` now (a free running slot and enough free KV), without
  // validating or copying it.
  bool HasRoomFor(const GenerationRequest& request) const;
  // Output constraints: the first request of a grammar has its mask cache prepared off the
  // engine thread (MaskPreparer) before it starts. PrepareMasks queues the request's grammars
  // (any thread; nothing for those prepared or in use); MasksReady says whether its grammar is
  // ready (Add does not wait: a request added before is served by the steps' own walks).
  void PrepareMasks(const GenerationRequest& request);
  bool MasksReady(const GenerationRequest& request) const;
  // MaskCaches::CostlyWalksInSteps: engine thread, between steps.
  int64_t CostlyMaskWalksInSteps() const { return mask_caches_.CostlyWalksInSteps(); }
  // Runs on the preparer's thread after each preparation (the engine wakes to admit); once this
  // returns, the one it replaced no longer runs.
  void SetOnMasksPrepared(std::function<void()> on_prepared) {
    mask_preparer_->SetOnPrepared(std::move(on_prepared));
  }
  // Retires a sequence now and frees its KV; its output reports kCancelled. NOT_FOUND if unknown.
  // With `kv_valid` false (the step that wrote it failed) its KV is not kept for reuse.
  absl::Status Cancel(uint64_t id, SequenceOutput* out, bool kv_valid = true);
  // Prompt tokens of a running sequence whose KV came from the prefix cache.
  int64_t CachedPromptTokens(uint64_t id) const;

  // Sessions (docs/SESSIONS.md). Engine thread, like everything here.
  int ExpireSessions(absl::Time now) { return prefix_->ExpireSessions(now); }
  absl::Status DeleteSession(const std::string& id) { return prefix_->DeleteSession(id); }
  PrefixCache::SessionPage ListSessions(const std::string& after = "",
                                        int64_t limit = INT64_MAX) const {
    return prefix_->ListSessions(after, limit);
  }
  absl::Time NextSessionExpiry() const { return prefix_->NextExpiry(); }
  const PrefixCacheCounters& prefix_cache_counters() const { return prefix_->counters(); }
  // Preemptions so far (cumulative).
  int64_t preemptions() const { return scheduler_->preemptions(); }
  // Tokens resumed sequences found still cached (not recomputed), cumulative.
  int64_t resumed_cached_tokens() const { return scheduler_->resumed_cached_tokens(); }

  bool HasWork() const { return !scheduler_->empty(); }
  size_t num_running() const { return scheduler_->size(); }

  // One forward pass: decode one token for every sequence past prefill, plus up to
  // prefill_chunk_tokens prompt tokens of sequences in prefill. Appends one output per sequence
  // that produced a token or finished; finished sequences are retired and their KV freed.
  absl::Status Step(std::vector<SequenceOutput>* outputs);
  const StepStats& last_step() const { return last_step_; }
  // The backend's device fault (Backend::device_fault): once set, every Step fails with it.
  const absl::Status& device_fault() const { return backend_->device_fault(); }

  // Convenience for offline use and tests: runs requests to completion, batched together.
  // Sequences the caller added before advance too (their outputs are not returned). On error,
  // the requests of this call are cancelled and their KV freed.
  absl::StatusOr<std::vector<GenerationResult>> GenerateAll(std::vector<GenerationRequest> reqs);

 private:
  Generator() = default;
  // The tokenizer, the stop ids (generation_config.json, config.json, the tokenizer's EOS) and
  // the output constraints' token table and masker.
  absl::Status LoadTokenizer(const std::string& model_dir);
  // The KV pool, the host store, the sparse cache and the prefix cache; then the KV managers,
  // the scheduler and the runner over them.
  absl::Status CreateKv();
  void CreateScheduling();
  // The step's one synchronization, then each sampled row's token to its sequence, and retiring.
  absl::Status FinishStep(const ScheduledStep& step, std::vector<SequenceOutput>* outputs);
  KvManager& KvFor(const GenerationRequest& request) const;
  int64_t TotalTokens(const GenerationRequest& r) const;

  GeneratorOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  KvPool kv_ = KvPool();
  // Host pages: sparse requests' KV and sessions' (null without kv_cache.host_capacity_tokens).
  std::unique_ptr<HostKvStore> host_;
  std::unique_ptr<SparseKvCache> sparse_;  // null unless sparse.enabled; after kv_ and host_
  std::unique_ptr<PrefixCache> prefix_;    // after kv_, host_ and sparse_ (holds their pages)
  absl::flat_hash_set<int32_t> eos_ids_;
  // The vocabulary as output constraints see it, and the scratch of their masks (whose threads
  // build mask cache entries on the MaskWorker while a forward pass runs: on the CPU backend,
  // beside its own threads).
  std::unique_ptr<grammar::TokenTable> token_table_;
  // The costly walks (a JSON string's) of every schema, walked once per process (issue 38).
  std::unique_ptr<grammar::SharedMaskEntries> shared_mask_entries_;
  std::unique_ptr<grammar::TokenMasker> masker_;  // after token_table_ and shared_mask_entries_
  std::unique_ptr<MaskWorker> mask_worker_;  // uses masker_
  MaskCaches mask_caches_;
  std::unique_ptr<MaskPreparer> mask_preparer_;  // after what it uses: stops first
  uint64_t next_id_ = 1;
  std::unique_ptr<DenseKvAttention> dense_attention_;
  std::unique_ptr<ModelRunner> runner_;  // after the model, the KV pool and the sparse cache
  // Declared before the managers, so destroyed after them: the sparse manager's layer-major
  // prefills refer to working sets the scheduler's sequences own.
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<DenseKvManager> dense_kv_;
  std::unique_ptr<SparseKvManager> sparse_kv_;  // null unless sparse.enabled
  LoadTimings load_timings_;
  StepStats last_step_;
};

}  // namespace specula
