// The Generator: batching, stopping, validation and KV accounting.
#include "engine/generate/generator.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "engine/backend/step_plan.h"
#include "engine/common/capacity_error.h"
#include "engine/common/fault_injection.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/kv/dense_attention.h"
#include "engine/kv/kv_pool.h"
#include "gtest/gtest.h"
#include "tests/engine/generate/forward_helpers.h"
#include "tests/engine/generate/greedy_request.h"

namespace specula {
namespace {

using ::specula::testing::Greedy;
using ::specula::testing::TestModelDir;

std::vector<GenerationRequest> MixedRequests() {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> prompt;
    for (int j = 0; j < 3 + 7 * i; ++j) prompt.push_back(1 + (i * 31 + j * 13) % 250);
    reqs.push_back(Greedy(prompt, 5 + 3 * i));
  }
  return reqs;
}

TEST(GeneratorTest, BatchedDecodeEqualsOneByOne) {
  for (const char* model : {"llama3-f32", "qwen3-bf16"}) {
    GeneratorOptions opt;
    opt.prefill_chunk_tokens = 8;  // prompts are prefilled over several steps, mixed with decode
    auto batched = Generator::Create(TestModelDir(model), opt).value();
    auto together = batched->GenerateAll(MixedRequests()).value();
    auto solo = Generator::Create(TestModelDir(model), GeneratorOptions{}).value();
    for (size_t i = 0; i < together.size(); ++i) {
      auto alone = solo->GenerateAll({MixedRequests()[i]}).value();
      EXPECT_EQ(together[i].tokens, alone[0].tokens) << model << " request " << i;
      EXPECT_EQ(together[i].text, alone[0].text) << model << " request " << i;
      EXPECT_EQ(together[i].finish, FinishReason::kLength);
      EXPECT_EQ(static_cast<int>(together[i].tokens.size()), 5 + 3 * static_cast<int>(i));
    }
    EXPECT_EQ(batched->kv_pool().used_blocks(), 0);
  }
}

TEST(GeneratorTest, SameSeedSameSample) {
  auto gen = Generator::Create(TestModelDir("llama3-f32"), GeneratorOptions{}).value();
  GenerationRequest r = Greedy({1, 2, 3, 4}, 16);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 7;
  auto a = gen->GenerateAll({r, r}).value();
  EXPECT_EQ(a[0].tokens, a[1].tokens);
  r.sampling.seed = 8;
  auto b = gen->GenerateAll({r}).value();
  EXPECT_NE(a[0].tokens, b[0].tokens);
}

// A step samples on the backend (SampleRows) unless a row has a penalty, and then on the host.
// A seeded request's tokens and logprobs must not depend on which: it shares each step with a
// neighbour of the same shape, once plain (device steps) and once with a repetition penalty (host
// steps), so its logits are the same in both runs and only the sampling path differs.
TEST(GeneratorTest, ASeededRequestSamplesTheSameOnTheDeviceAndOnTheHost) {
  GenerationRequest seeded = Greedy({1, 2, 3, 4}, 16);
  seeded.sampling.temperature = 3.0f;  // the test model is near-deterministic when cooler
  seeded.sampling.top_p = 0.95f;
  seeded.sampling.seed = 11;
  seeded.sampling.logprobs = 2;
  struct Run {
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    int device_steps = 0, host_steps = 0;
  };
  auto run = [&](float neighbour_penalty) {
    auto gen = Generator::Create(TestModelDir("llama3-f32"), GeneratorOptions{}).value();
    const uint64_t id = gen->Add(seeded).value();
    GenerationRequest neighbour = Greedy({5, 6, 7, 8}, 16);
    neighbour.sampling.repetition_penalty = neighbour_penalty;
    EXPECT_TRUE(gen->Add(neighbour).ok());
    Run r;
    std::vector<SequenceOutput> out;
    while (gen->HasWork()) {
      out.clear();
      EXPECT_TRUE(gen->Step(&out).ok());
      ++(gen->last_step().sampled_on_device ? r.device_steps : r.host_steps);
      for (const SequenceOutput& o : out) {
        if (o.id != id) continue;
        r.tokens.insert(r.tokens.end(), o.tokens.begin(), o.tokens.end());
        for (const SampledToken& t : o.logprobs) {
          r.logprobs.push_back(t.logprob);
          for (const TokenLogprob& alt : t.top) r.logprobs.push_back(alt.logprob);
        }
      }
    }
    return r;
  };
  const Run device = run(1.0f), host = run(1.2f);
  seeded.sampling.seed = 12;  // the draws decide the tokens: another stream gives others
  EXPECT_NE(run(1.0f).tokens, device.tokens);
  EXPECT_EQ(device.host_steps, 0);
  EXPECT_EQ(host.device_steps, 0);
  EXPECT_EQ(device.tokens.size(), 16u);
  EXPECT_EQ(device.tokens, host.tokens);
  EXPECT_EQ(device.logprobs, host.logprobs);
  EXPECT_EQ(device.logprobs.size(), 16u * 3);
}

TEST(GeneratorTest, StopStringEndsTextBeforeIt) {
  auto gen = Generator::Create(TestModelDir("llama3-f32"), GeneratorOptions{}).value();
  auto full = gen->GenerateAll({Greedy({1, 80, 81, 82}, 24)}).value()[0];
  ASSERT_GE(full.text.size(), 8u);
  // A stop string from the middle of the unconstrained output.
  const std::string stop = full.text.substr(full.text.size() / 2, 2);
  const size_t at = full.text.find(stop);
  GenerationRequest r = Greedy({1, 80, 81, 82}, 24);
  r.stopping.stop = {stop};
  auto stopped = gen->GenerateAll({r}).value()[0];
  EXPECT_EQ(stopped.finish, FinishReason::kStopSequence);
  EXPECT_EQ(stopped.text, full.text.substr(0, at));
  EXPECT_LE(stopped.tokens.size(), full.tokens.size());
}

TEST(GeneratorTest, StopTokenIdEndsAtFirstOccurrence) {
  auto gen = Generator::Create(TestModelDir("qwen2-f32"), GeneratorOptions{}).value();
  auto full = gen->GenerateAll({Greedy({5, 6, 7}, 20)}).value()[0];
  const int32_t stop_id = full.tokens[4];
  size_t first = 0;
  while (full.tokens[first] != stop_id) ++first;
  GenerationRequest r = Greedy({5, 6, 7}, 20);
  r.stopping.stop_token_ids = {stop_id};
  auto stopped = gen->GenerateAll({r}).value()[0];
  EXPECT_EQ(stopped.finish, FinishReason::kStop);
  EXPECT_EQ(stopped.tokens,
            std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + first + 1));
}

TEST(GeneratorTest, LogprobsAreReportedWhenAsked) {
  auto gen = Generator::Create(TestModelDir("mistral-f32"), GeneratorOptions{}).value();
  GenerationRequest r = Greedy({1, 9, 8}, 4);
  r.sampling.logprobs = 3;
  auto res = gen->GenerateAll({r}).value()[0];
  ASSERT_EQ(res.logprobs.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_EQ(res.logprobs[i].top.size(), 3u);
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ(res.logprobs[i].top[0].token, res.tokens[i]);
    EXPECT_FLOAT_EQ(res.logprobs[i].top[0].logprob, res.logprobs[i].logprob);
    EXPECT_LE(res.logprobs[i].logprob, 0.0f);
  }
}

TEST(GeneratorTest, InvalidRequestsNameTheProblem) {
  auto gen = Generator::Create(TestModelDir("llama-f32"), GeneratorOptions{}).value();
  const int64_t vocab = gen->model_config().vocab_size;
  EXPECT_EQ(gen->Add(Greedy({}, 4)).status().code(), absl::StatusCode::kInvalidArgument);
  auto bad_id = gen->Add(Greedy({1, static_cast<int32_t>(vocab)}, 4));
  EXPECT_EQ(bad_id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_id.status().message().find("prompt_token_ids[1]"), std::string::npos);
  auto too_long =
      gen->Add(Greedy({1}, static_cast<int>(gen->model_config().max_position_embeddings)));
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.status().message().find("max_tokens"), std::string::npos);
  GenerationRequest bad_temp = Greedy({1}, 4);
  bad_temp.sampling.temperature = -1;
  EXPECT_NE(gen->Add(bad_temp).status().message().find("temperature"), std::string::npos);
  EXPECT_EQ(gen->kv_pool().used_blocks(), 0);
}

// Host synchronizations and device reads of each decode step after the first step, which must
// prefill every prompt.
struct StepSyncs {
  int64_t syncs = 0;
  int64_t reads = 0;
  bool operator==(const StepSyncs&) const = default;
  friend void PrintTo(const StepSyncs& s, std::ostream* os) {
    *os << "{syncs " << s.syncs << ", reads " << s.reads << "}";
  }
};

std::vector<StepSyncs> DecodeStepSyncs(Generator& gen, int steps) {
  std::vector<SequenceOutput> out;
  EXPECT_TRUE(gen.Step(&out).ok());  // prefill
  std::vector<StepSyncs> per_step;
  for (int i = 0; i < steps; ++i) {
    const BackendCounters& c = gen.backend_counters();
    const StepSyncs before{c.host_syncs.load(), c.host_reads.load()};
    EXPECT_TRUE(gen.Step(&out).ok());
    per_step.push_back({c.host_syncs.load() - before.syncs, c.host_reads.load() - before.reads});
  }
  return per_step;
}

TEST(GeneratorTest, ADenseDecodeStepSynchronizesWithTheHostOnce) {
  // One readback of every sequence's logits, whatever the batch size and layer count: a
  // per-layer or per-sequence synchronization would stall a GPU's queue.
  auto gen = Generator::Create(TestModelDir("qwen3-f32"), GeneratorOptions{}).value();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(gen->Add(Greedy({1, 2, 3, 4 + i}, 8)).ok());
  const std::vector<StepSyncs> steps = DecodeStepSyncs(*gen, 5);
  EXPECT_EQ(steps, std::vector<StepSyncs>(5, StepSyncs{1, 1}));
}

// A step's wait for the device is told apart from its host work: in a step whose host work
// stalls 50 ms (before the forward pass) and whose readback waits 50 ms for a slow device, the
// step reports at least the device's 50 ms as waiting and leaves at least the host's 50 ms out.
TEST(GeneratorTest, AStepReportsHowLongItWaitedForTheDevice) {
  if (!kFaultInjection) GTEST_SKIP() << "built without fault injection";
  auto gen = Generator::Create(TestModelDir("qwen3-f32"), GeneratorOptions{}).value();
  ASSERT_TRUE(gen->Add(Greedy({1, 2, 3, 4}, 8)).ok());
  std::vector<SequenceOutput> out;
  ASSERT_TRUE(gen->Step(&out).ok());  // the prompt
  ArmFault(Fault::kStallStep, 1, absl::Milliseconds(50));
  ArmFault(Fault::kSlowDevice, 1, absl::Milliseconds(50));
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(gen->Step(&out).ok());
  const double step =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  DisarmFaults();
  EXPECT_GE(gen->last_step().device_wait_seconds, 0.05);
  EXPECT_LE(gen->last_step().device_wait_seconds, step - 0.05);
}

// A device fault seen at a step's readback (injected: the device lost) fails that step, with no
// token taken from what was read back, and every later step, with the fault's message.
TEST(GeneratorTest, ADeviceFaultFailsTheStepAndEveryLaterOne) {
  if (!kFaultInjection) GTEST_SKIP() << "built without fault injection";
  auto gen = Generator::Create(TestModelDir("qwen3-f32"), GeneratorOptions{}).value();
  ASSERT_TRUE(gen->Add(Greedy({1, 2, 3, 4}, 8)).ok());
  std::vector<SequenceOutput> out;
  ASSERT_TRUE(gen->Step(&out).ok());
  out.clear();
  ArmFault(Fault::kDeviceLost);
  const absl::Status failed = gen->Step(&out);
  DisarmFaults();
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal);
  EXPECT_NE(failed.message().find("device lost"), absl::string_view::npos) << failed;
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(gen->device_fault(), failed);
  EXPECT_EQ(gen->Step(&out), failed);
}

// Selection, residency and prefetch planning run on the device, so a sparse decode step also
// synchronizes once: the logits' readback (the counters come back with it, asynchronously). A
// per-layer query readback, a host-side summary of a page filled this step, a host wait for a
// prefetch or a finished sequence's release waiting for its copies would each show here. The
// steps must really select and stage pages, or the count would prove nothing; the requests end at
// different steps, so releases happen while others decode.
TEST(GeneratorTest, ASparseDecodeStepSynchronizesWithTheHostOnce) {
  for (SpeculationMode mode : {SpeculationMode::kNone, SpeculationMode::kCrossStep,
                               SpeculationMode::kCrossLayer, SpeculationMode::kBoth}) {
    for (MissPolicy miss : {MissPolicy::kDefer, MissPolicy::kFetch}) {
      GeneratorOptions o;
      o.sparse.enabled = true;
      o.sparse.min_context_tokens = 0;
      o.sparse.budget_tokens = 32;
      o.sparse.sink_tokens = 16;
      o.sparse.recent_tokens = 32;
      o.sparse.prefetch_extra_tokens = 32;
      o.host_capacity_tokens = 4096;
      o.sparse.speculation = mode;
      o.sparse.miss_policy = miss;
      o.prefill_chunk_tokens = 1024;  // every prompt within the first steps
      auto gen = Generator::Create(TestModelDir("qwen3-f32"), o).value();
      const int32_t prompt_len = 200;
      std::vector<int32_t> prompt;
      for (int32_t j = 0; j < prompt_len; ++j) prompt.push_back(1 + j % 250);
      for (int i = 0; i < 3; ++i) ASSERT_TRUE(gen->Add(Greedy(prompt, 12 + 10 * i)).ok());
      std::vector<SequenceOutput> out;
      while (out.size() < 3) ASSERT_TRUE(gen->Step(&out).ok());  // the layer-major prefills
      int64_t selected = 0, staged = 0, finished = 0;
      const BackendCounters& c = gen->backend_counters();
      for (int step = 0; gen->HasWork(); ++step) {
        const StepSyncs before{c.host_syncs.load(), c.host_reads.load()};
        out.clear();
        ASSERT_TRUE(gen->Step(&out).ok());
        const StepSyncs got{c.host_syncs.load() - before.syncs, c.host_reads.load() - before.reads};
        EXPECT_EQ(got, (StepSyncs{1, 1}))
            << SpeculationModeName(mode) << " " << MissPolicyName(miss) << " step " << step;
        const SparseStepStats& s = gen->last_step().sparse;
        selected += s.pages_hit + s.pages_missed + s.pages_late;
        staged += s.bytes_prefetched;
        for (const SequenceOutput& so : out) finished += so.finish != FinishReason::kNone;
      }
      EXPECT_EQ(finished, 3);
      EXPECT_GT(selected, 0) << SpeculationModeName(mode);
      EXPECT_GT(staged, 0) << SpeculationModeName(mode);  // misses at least are staged
      // The released slots are handed out again (after their copies landed).
      EXPECT_EQ(gen->device_slots_used(), 0);
      auto again = gen->GenerateAll({Greedy(prompt, 4)});
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_EQ(again->front().tokens.size(), 4u);
    }
  }
}

// A layer-major prefill step synchronizes once too (a plain wait when nothing samples yet).
TEST(GeneratorTest, ALayerMajorPrefillStepSynchronizesOnce) {
  GeneratorOptions o;
  o.sparse.enabled = true;
  o.sparse.min_context_tokens = 0;
  o.sparse.budget_tokens = 32;
  o.host_capacity_tokens = 4096;
  o.prefill_chunk_tokens = 32;  // 200 tokens: several steps per layer
  auto gen = Generator::Create(TestModelDir("qwen3-f32"), o).value();
  std::vector<int32_t> prompt(200, 7);
  ASSERT_TRUE(gen->Add(Greedy(prompt, 4)).ok());
  std::vector<SequenceOutput> out;
  const BackendCounters& c = gen->backend_counters();
  int steps = 0;
  while (out.empty()) {
    const int64_t before = c.host_syncs.load();
    ASSERT_TRUE(gen->Step(&out).ok());
    EXPECT_EQ(c.host_syncs.load() - before, 1) << "step " << steps;
    ++steps;
  }
  // 200 tokens x layers in units of 32 rows, 32 x layers rows a step: 7 steps.
  EXPECT_EQ(steps, 7);
}

// A copy of test model `name` whose embedding row `token` is NaN: only a request holding that
// token computes NaN (the model's lm_head is its own, not the embedding).
std::string ModelWithNanEmbedding(const std::string& name, int32_t token, int64_t hidden) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("specula_nan_model_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(TestModelDir(name))) {
    fs::copy(e.path(), dir / e.path().filename());
  }
  std::fstream f(dir / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header_bytes = 0;
  f.read(reinterpret_cast<char*>(&header_bytes), sizeof(header_bytes));
  std::string header(header_bytes, '\0');
  f.read(header.data(), static_cast<std::streamsize>(header_bytes));
  const size_t tensor = header.find("\"model.embed_tokens.weight\"");
  const size_t offsets = header.find("\"data_offsets\":[", tensor);
  EXPECT_NE(tensor, std::string::npos);
  EXPECT_NE(offsets, std::string::npos);
  EXPECT_NE(header.find("\"F32\"", tensor), std::string::npos);
  const uint64_t begin = std::stoull(header.substr(offsets + 16));
  f.seekp(static_cast<std::streamoff>(8 + header_bytes + begin + token * hidden * sizeof(float)));
  const std::vector<float> nan(hidden, std::numeric_limits<float>::quiet_NaN());
  f.write(reinterpret_cast<const char*>(nan.data()), hidden * sizeof(float));
  EXPECT_TRUE(f.good());
  return dir.string();
}

// NaN logits fail only the request that produced them (INTERNAL), and its KV is never reused:
// its session keeps nothing. The request beside it in the batch (with `good_penalty`) answers
// exactly as it does on the unpoisoned model.
void ExpectNonFiniteLogitsFailOnlyTheirRequest(float good_penalty) {
  const int32_t poison = 7;
  const int64_t hidden = Generator::Create(TestModelDir("llama-f32"), GeneratorOptions{})
                             .value()
                             ->model_config()
                             .hidden_size;
  const std::string poisoned = ModelWithNanEmbedding("llama-f32", poison, hidden);
  auto gen = Generator::Create(poisoned, GeneratorOptions{}).value();
  std::vector<int32_t> bad_prompt, good_prompt;
  for (int32_t i = 0; i < 40; ++i) {
    bad_prompt.push_back(i == 20 ? poison : 10 + i);
    good_prompt.push_back(60 + i);
  }
  GenerationRequest bad = Greedy(bad_prompt, 4);
  bad.session_id = "agent";
  const uint64_t bad_id = gen->Add(bad).value();
  GenerationRequest good = Greedy(good_prompt, 4);
  good.sampling.repetition_penalty = good_penalty;
  const uint64_t good_id = gen->Add(good).value();
  std::vector<int32_t> good_tokens;
  absl::Status bad_status;
  std::vector<SequenceOutput> out;
  while (gen->HasWork()) {
    out.clear();
    ASSERT_TRUE(gen->Step(&out).ok());
    EXPECT_EQ(gen->last_step().sampled_on_device, good_penalty == 1.0f);
    for (const SequenceOutput& o : out) {
      if (o.id == bad_id) {
        EXPECT_TRUE(o.tokens.empty());
        EXPECT_EQ(o.finish, FinishReason::kNone);
        bad_status = o.error;
      } else {
        EXPECT_EQ(o.id, good_id);
        EXPECT_TRUE(o.error.ok()) << o.error;
        good_tokens.insert(good_tokens.end(), o.tokens.begin(), o.tokens.end());
      }
    }
  }
  EXPECT_EQ(bad_status.code(), absl::StatusCode::kInternal) << bad_status;
  EXPECT_NE(bad_status.message().find("non-finite"), std::string::npos);
  auto clean = Generator::Create(TestModelDir("llama-f32"), GeneratorOptions{}).value();
  EXPECT_EQ(good_tokens, clean->GenerateAll({good}).value()[0].tokens);
  for (const SessionInfo& s : gen->ListSessions().sessions) EXPECT_EQ(s.tokens, 0) << s.id;
  EXPECT_EQ(gen->kv_blocks_used(), 0);
  // GenerateAll reports the failure too.
  EXPECT_EQ(gen->GenerateAll({Greedy(bad_prompt, 2)}).status().code(), absl::StatusCode::kInternal);
  std::filesystem::remove_all(poisoned);
}

// On both sampling paths: plain requests sample on the backend (which reports the row), and a
// penalty on the good request moves every step to the host (which checks the logits).
TEST(GeneratorTest, NonFiniteLogitsFailOnlyTheirRequestAndDiscardItsKv) {
  for (float penalty : {1.0f, 1.3f}) {
    SCOPED_TRACE(penalty == 1.0f ? "device sampling" : "host sampling");
    ExpectNonFiniteLogitsFailOnlyTheirRequest(penalty);
  }
}

TEST(GeneratorTest, FullCacheIsResourceExhaustedAndCancelFreesBlocks) {
  GeneratorOptions opt;
  opt.kv_cache_tokens = 64;
  opt.page_size = 16;
  auto gen = Generator::Create(TestModelDir("llama-f32"), opt).value();
  // Admission takes what a request needs now: its prompt and first token (decode grows it).
  std::vector<int32_t> prompt40(40, 5), prompt30(30, 6);
  auto a = gen->Add(Greedy(prompt40, 20));  // 41 tokens now: 3 of 4 blocks
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(gen->kv_pool().used_blocks(), 3);
  auto b = gen->Add(Greedy(prompt30, 1));  // needs 2 blocks now, 1 free
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(IsNeverFits(b.status())) << "it fits once a finishes";
  EXPECT_FALSE(gen->HasRoomFor(Greedy(prompt30, 1)));
  auto never = gen->Add(Greedy({1, 2, 3}, 100));  // could never fit
  EXPECT_TRUE(IsNeverFits(never.status())) << never.status();
  EXPECT_NE(never.status().message().find("kv_cache.capacity_tokens"), std::string::npos);
  std::vector<SequenceOutput> out;
  ASSERT_TRUE(gen->Step(&out).ok());
  SequenceOutput cancelled;
  ASSERT_TRUE(gen->Cancel(*a, &cancelled).ok());
  EXPECT_EQ(cancelled.finish, FinishReason::kCancelled);
  EXPECT_EQ(gen->kv_pool().used_blocks(), 0);
  EXPECT_FALSE(gen->HasWork());
  EXPECT_EQ(gen->Cancel(*a, &cancelled).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(gen->Add(Greedy({1, 2, 3}, 20)).ok());
}

TEST(GeneratorTest, EosFromGenerationConfigEndsGenerationUnlessIgnored) {
  namespace fs = std::filesystem;
  const std::string src = TestModelDir("llama3-f32");
  auto gen = Generator::Create(src, GeneratorOptions{}).value();
  auto full = gen->GenerateAll({Greedy({1, 30, 31}, 8)}).value()[0];
  const int32_t eos = full.tokens[2];
  size_t first = 0;
  while (full.tokens[first] != eos) ++first;

  // The same model, with that token declared EOS in generation_config.json.
  const fs::path dir = fs::temp_directory_path() / ("specula_eos_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::copy(src, dir, fs::copy_options::recursive);
  std::ofstream(dir / "generation_config.json") << "{\"eos_token_id\": [" << eos << "]}";
  auto eos_gen = Generator::Create(dir.string(), GeneratorOptions{}).value();
  EXPECT_TRUE(eos_gen->eos_ids().contains(eos));
  GenerationRequest r = Greedy({1, 30, 31}, 8);
  r.stopping.ignore_eos = false;
  auto stopped = eos_gen->GenerateAll({r}).value()[0];
  EXPECT_EQ(stopped.finish, FinishReason::kStop);
  EXPECT_EQ(stopped.tokens,
            std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + first + 1));
  r.stopping.ignore_eos = true;
  auto ignored = eos_gen->GenerateAll({r}).value()[0];
  EXPECT_EQ(ignored.tokens, full.tokens);
  EXPECT_EQ(ignored.finish, FinishReason::kLength);
  fs::remove_all(dir);
}

TEST(GeneratorTest, CancelDuringPrefillFreesBlocks) {
  GeneratorOptions opt;
  opt.prefill_chunk_tokens = 4;
  auto gen = Generator::Create(TestModelDir("qwen3-f32"), opt).value();
  std::vector<int32_t> prompt(20, 7);
  auto id = gen->Add(Greedy(prompt, 8)).value();
  std::vector<SequenceOutput> out;
  ASSERT_TRUE(gen->Step(&out).ok());
  EXPECT_TRUE(out.empty());  // 4 of 20 prompt tokens done: nothing sampled yet
  SequenceOutput cancelled;
  ASSERT_TRUE(gen->Cancel(id, &cancelled).ok());
  EXPECT_EQ(gen->kv_pool().used_blocks(), 0);
  EXPECT_FALSE(gen->HasWork());
}

// While nothing decodes, a prompt takes solo_prefill_chunk_tokens a step; once a sequence
// decodes, prompts share prefill_chunk_tokens with it, so its time between tokens stays short.
TEST(GeneratorTest, PromptsTakeTheSoloBudgetOnlyWhileNothingDecodes) {
  GeneratorOptions opt;
  opt.prefill_chunk_tokens = 4;
  opt.solo_prefill_chunk_tokens = 16;
  auto gen = Generator::Create(TestModelDir("qwen3-f32"), opt).value();
  // Steps until `id` has an output (its first token).
  auto steps_to_first_token = [&](uint64_t id) {
    for (int steps = 1; steps <= 100; ++steps) {
      std::vector<SequenceOutput> out;
      EXPECT_TRUE(gen->Step(&out).ok());
      for (const SequenceOutput& o : out) {
        if (o.id == id && !o.tokens.empty()) return steps;
      }
    }
    return -1;
  };
  const uint64_t alone = gen->Add(Greedy(std::vector<int32_t>(20, 7), 100)).value();
  EXPECT_EQ(steps_to_first_token(alone), 2);  // 16 + 4 prompt tokens
  const uint64_t beside = gen->Add(Greedy(std::vector<int32_t>(20, 9), 1)).value();
  EXPECT_EQ(steps_to_first_token(beside), 5);  // 4 a step beside the decoding sequence
  SequenceOutput o;
  EXPECT_TRUE(gen->Cancel(alone, &o).ok());
  EXPECT_EQ(gen->kv_pool().used_blocks(), 0);
}

TEST(GeneratorTest, GenerateAllLeavesCallerSequencesRunning) {
  auto gen = Generator::Create(TestModelDir("llama-f32"), GeneratorOptions{}).value();
  auto own = gen->Add(Greedy({1, 2}, 200)).value();
  auto res = gen->GenerateAll({Greedy({3, 4}, 3)}).value();
  EXPECT_EQ(res[0].tokens.size(), 3u);
  EXPECT_TRUE(gen->HasWork());  // the caller's long request is still running
  SequenceOutput o;
  EXPECT_TRUE(gen->Cancel(own, &o).ok());
  EXPECT_EQ(gen->kv_pool().used_blocks(), 0);
}

// The CPU backend, recording what each PagedAttention call was given.
class RecordingBackend : public CpuBackend {
 public:
  RecordingBackend() : CpuBackend(1) {}
  struct Call {
    int32_t first_row, rows, seqs, max_seq_rows;
    bool operator==(const Call&) const = default;
  };
  void PagedAttention(const Mat& q, const AttentionBatch& batch, const KvLayerView& layer,
                      Mat* out) override {
    calls.push_back({batch.first_row, batch.rows, batch.seqs, batch.max_seq_rows});
    max_keys.push_back(batch.max_keys);
    CpuBackend::PagedAttention(q, batch, layer, out);
  }
  std::vector<Call> calls;
  std::vector<int32_t> max_keys;
};

// Decode rows attend in their own call, without sequences (a GPU keeps them on its decode
// kernel); the prefill chunks after them in another, with their sequences (its tile kernel).
TEST(DenseKvAttentionTest, DecodeRowsAndPrefillChunksAttendInSeparateCalls) {
  RecordingBackend backend;
  KvPool pool = KvPool::Create(backend, KvPoolOptions{1, 1, 4, 16, 16}).value();
  DenseKvAttention attention(backend, pool, 1, 0.5f);
  const std::vector<int32_t> a = {0}, b = {1}, c = {2, 3}, d = {4};
  auto attend = [&](const std::vector<DenseSeqRows>& seqs) {
    backend.calls.clear();
    StepPlan plan(backend);
    attention.Plan(seqs, plan);
    EXPECT_TRUE(plan.Upload().ok());
    attention.Bind(plan);
    const int32_t rows = attention.rows();
    DeviceBuffer buffer = backend.Allocate(4 * rows * 4 * sizeof(float)).value();
    float* base = buffer.as<float>();
    std::fill(base, base + 4 * rows * 4, 0.25f);
    Mat q(base, rows, 4), k(base + rows * 4, rows, 4), v(base + 2 * rows * 4, rows, 4);
    Mat out(base + 3 * rows * 4, rows, 4);
    attention.Attend(0, q, k, v, &out);
    return backend.calls;
  };
  using Call = RecordingBackend::Call;
  // Two decode rows, a 20-row chunk after 5 cached keys, the last token of another prompt.
  EXPECT_EQ(attend({{0, 1, 3, a}, {1, 1, 9, b}, {2, 20, 25, c}, {22, 1, 7, d}}),
            (std::vector<Call>{{0, 2, 0, 0}, {2, 21, 2, 20}}));
  EXPECT_EQ(attend({{0, 1, 3, a}, {1, 1, 9, b}}), (std::vector<Call>{{0, 2, 0, 0}}));
  EXPECT_EQ(attend({{0, 20, 25, c}}), (std::vector<Call>{{0, 20, 1, 20}}));
}

// Decode rows planned for a keys capacity (what a recorded decode step replays) keep one metadata
// layout and one attention launch shape while their contexts grow within it: the staged bytes
// and the attention's max_keys (which sizes the GPU's split-K) are the capacity's, not the
// longest context's. Without a capacity the two steps differ in both, so the check can fail.
TEST(DenseKvAttentionTest, DecodeRowsPlannedForACapacityKeepOneLayout) {
  RecordingBackend backend;
  // One-token pages: a block table as long as its context, so the tables' bytes show.
  KvPool pool = KvPool::Create(backend, KvPoolOptions{1, 1, 4, 1, 32}).value();
  DenseKvAttention attention(backend, pool, 1, 0.5f);
  std::vector<int32_t> a(16), b(16);
  std::iota(a.begin(), a.end(), 0);
  std::iota(b.begin(), b.end(), 16);
  auto plan_step = [&](int32_t len_a, int32_t len_b, int32_t capacity) {
    backend.max_keys.clear();
    StepPlan plan(backend);
    const std::vector<DenseSeqRows> seqs = {
        {0, 1, len_a, absl::MakeConstSpan(a).subspan(0, len_a)},
        {1, 1, len_b, absl::MakeConstSpan(b).subspan(0, len_b)}};
    attention.Plan(seqs, plan, capacity);
    EXPECT_TRUE(plan.Upload().ok());
    attention.Bind(plan);
    DeviceBuffer buffer = backend.Allocate(4 * 2 * 4 * sizeof(float)).value();
    float* base = buffer.as<float>();
    std::fill(base, base + 4 * 2 * 4, 0.25f);
    Mat q(base, 2, 4), k(base + 8, 2, 4), v(base + 16, 2, 4), out(base + 24, 2, 4);
    attention.Attend(0, q, k, v, &out);
    return std::make_pair(plan.staged_bytes(), backend.max_keys);
  };
  EXPECT_EQ(plan_step(3, 5, 16), plan_step(9, 16, 16));
  EXPECT_EQ(plan_step(3, 5, 16).second, std::vector<int32_t>{16});
  EXPECT_NE(plan_step(3, 5, 0).first, plan_step(9, 16, 0).first);
  EXPECT_NE(plan_step(3, 5, 0).second, plan_step(9, 16, 0).second);
}

// The dense planner's programmer-error checks: rows that do not tile the batch, or a block
// table too short for the keys, would make attention read outside the sequence's pages.
TEST(DenseKvAttentionDeathTest, InconsistentSequencesAreCaughtWhenPlanned) {
  CpuBackend backend(1);
  KvPool pool = KvPool::Create(backend, KvPoolOptions{1, 1, 4, 16, 4}).value();
  DenseKvAttention attention(backend, pool, 1, 4);
  StepPlan plan(backend);
  const std::vector<int32_t> one_block = {0};
  const DenseSeqRows gap{1, 2, 2, one_block};  // starts at row 1: row 0 belongs to nobody
  EXPECT_DEATH(attention.Plan(absl::MakeConstSpan(&gap, 1), plan), "tile the rows");
  const DenseSeqRows short_table{0, 1, 17, one_block};  // 17 keys need two blocks of 16
  EXPECT_DEATH(attention.Plan(absl::MakeConstSpan(&short_table, 1), plan), "");
}

}  // namespace
}  // namespace specula
