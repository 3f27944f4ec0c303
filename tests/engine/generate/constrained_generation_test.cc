// Structured outputs through the Generator: with random-weight models (the harshest case: the
// mask alone must make the output valid) every constrained answer follows its schema, ends by
// itself when the grammar is complete, and samples on the host.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/common/fault_injection.h"
#include "engine/generate/generator.h"
#include "engine/generate/mask_worker.h"
#include "engine/generate/output_constraint.h"
#include "engine/grammar/json_schema.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/generate/forward_helpers.h"

namespace specula {
namespace {

using ::specula::testing::TestModelDir;
using Json = nlohmann::ordered_json;

std::shared_ptr<const grammar::Grammar> Compile(const char* schema) {
  grammar::JsonSchemaOptions options;
  options.strict = true;
  auto g = grammar::CompileJsonSchema(Json::parse(schema), options);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : nullptr;
}

GenerationRequest Constrained(std::shared_ptr<const grammar::Grammar> g, uint64_t seed) {
  GenerationRequest r;
  r.prompt = {1, 2, 3, 4, 5};
  r.sampling.temperature = 1.0f;
  r.sampling.seed = seed;
  r.stopping.max_tokens = 300;
  r.constraint.grammar = std::move(g);
  return r;
}

constexpr const char* kWeather = R"({
  "type": "object",
  "properties": {"city": {"type": "string", "maxLength": 12},
                 "unit": {"enum": ["celsius", "fahrenheit"]},
                 "days": {"type": "integer"},
                 "alerts": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
  "required": ["city", "unit", "days", "alerts"],
  "additionalProperties": false})";

// Byte-level BPE (Llama 3), SentencePiece with byte fallback (Mistral) and Qwen2's tokenizer:
// tokens that hold several JSON tokens, half a UTF-8 character or leading spaces.
TEST(ConstrainedGenerationTest, EveryAnswerFollowsTheSchemaOnEveryTokenizer) {
  for (const char* model : {"llama3-f32", "mistral-f32", "qwen2-f32"}) {
    auto gen = Generator::Create(TestModelDir(model), GeneratorOptions{}).value();
    std::vector<GenerationRequest> requests;
    for (uint64_t seed = 0; seed < 8; ++seed)
      requests.push_back(Constrained(Compile(kWeather), seed));
    auto results = gen->GenerateAll(requests).value();
    int ended = 0;
    for (const auto& r : results) {
      if (r.finish != FinishReason::kStop) continue;
      ++ended;
      const Json answer = Json::parse(r.text);  // throws (fails the test) when not JSON
      ASSERT_EQ(answer.size(), 4u) << model << ": " << r.text;
      EXPECT_LE(answer["city"].get<std::string>().size(), 12u * 4) << r.text;
      EXPECT_TRUE(answer["unit"] == "celsius" || answer["unit"] == "fahrenheit") << r.text;
      EXPECT_TRUE(answer["days"].is_number_integer()) << r.text;
      EXPECT_LE(answer["alerts"].size(), 3u) << r.text;
    }
    EXPECT_GE(ended, 8) << model << ": most answers end by themselves within 300 tokens";
  }
}

// The issue's end rate: answers of a random-weight model to the ~50 agent-style schemas of
// agent_schemas.json (whose grammars json_schema_samples_test checks sentence by sentence with
// Python's jsonschema) are JSON texts, and at least 9 in 10 end by themselves within 300 tokens.
TEST(ConstrainedGenerationTest, NineInTenAnswersToTheAgentSchemasEndByThemselves) {
  std::ifstream in(std::string(SPECULA_SOURCE_DIR) + "/tests/engine/grammar/agent_schemas.json");
  const Json schemas = Json::parse(in);
  ASSERT_GE(schemas.size(), 50u);
  auto gen = Generator::Create(TestModelDir("llama3-f32"), GeneratorOptions{}).value();
  constexpr uint64_t kSeeds = 2;
  std::vector<GenerationRequest> requests;
  for (size_t i = 0; i < schemas.size(); ++i) {
    grammar::JsonSchemaOptions options;
    options.strict = schemas[i].value("strict", false);
    auto g = grammar::CompileJsonSchema(schemas[i]["schema"], options);
    ASSERT_TRUE(g.ok()) << "schema " << i << ": " << g.status();
    for (uint64_t seed = 0; seed < kSeeds; ++seed)
      requests.push_back(Constrained(*g, 100 * i + seed));
  }
  auto results = gen->GenerateAll(requests).value();
  size_t ended = 0;
  for (size_t k = 0; k < results.size(); ++k) {
    if (results[k].finish != FinishReason::kStop) continue;
    ++ended;
    EXPECT_TRUE(Json::accept(results[k].text))
        << "schema " << k / kSeeds << ": " << results[k].text;
  }
  EXPECT_GE(ended * 10, results.size() * 9) << ended << " of " << results.size() << " ended";
}

TEST(ConstrainedGenerationTest, AnEnumAnswerIsOneOfItsValuesAndEndsThere) {
  auto gen = Generator::Create(TestModelDir("llama3-f32"), GeneratorOptions{}).value();
  auto g = Compile(R"({"enum": ["alpha", "beta", "gamma delta"]})");
  for (uint64_t seed = 0; seed < 6; ++seed) {
    GenerationRequest r = Constrained(g, seed);
    r.stopping.ignore_eos = true;  // the grammar's end ends it, not an EOS
    auto result = gen->GenerateAll({r}).value()[0];
    EXPECT_EQ(result.finish, FinishReason::kStop);
    EXPECT_TRUE(result.text == "\"alpha\"" || result.text == "\"beta\"" ||
                result.text == "\"gamma delta\"")
        << result.text;
  }
}

// A constrained row's mask is applied where its logits are (Backend::MaskLogits), so its steps
// sample on the device; beside a neighbour with a penalty the step samples on the host, with the
// mask applied there. Either way the same seeded request gives the same tokens as alone: the
// device mask equals the host's, and a row's draws do not depend on its neighbours.
TEST(ConstrainedGenerationTest, ConstrainedRowsGiveTheSameTokensSampledOnTheDeviceOrTheHost) {
  auto g = Compile(kWeather);
  auto alone = Generator::Create(TestModelDir("llama3-f32"), GeneratorOptions{}).value();
  const auto solo = alone->GenerateAll({Constrained(g, 3)}).value()[0];
  ASSERT_EQ(solo.finish, FinishReason::kStop);
  for (const bool penalised_neighbour : {false, true}) {
    SCOPED_TRACE(penalised_neighbour ? "host" : "device");
    auto gen = Generator::Create(TestModelDir("llama3-f32"), GeneratorOptions{}).value();
    GenerationRequest neighbour = Constrained(nullptr, 9);
    neighbour.stopping.max_tokens = 400;  // outlives the constrained answer
    if (penalised_neighbour) neighbour.sampling.repetition_penalty = 1.3f;
    ASSERT_TRUE(gen->Add(neighbour).ok());  // first: the constrained row is not row 0
    const uint64_t id = gen->Add(Constrained(g, 3)).value();
    std::vector<int32_t> tokens;
    std::vector<SequenceOutput> out;
    bool done = false;
    while (!done) {
      out.clear();
      ASSERT_TRUE(gen->Step(&out).ok());
      if (gen->last_step().decode_rows > 0) {
        EXPECT_EQ(gen->last_step().sampled_on_device, !penalised_neighbour);
      }
      for (const SequenceOutput& o : out) {
        if (o.id != id) continue;
        ASSERT_TRUE(o.error.ok()) << o.error;
        tokens.insert(tokens.end(), o.tokens.begin(), o.tokens.end());
        done = o.finish != FinishReason::kNone;
      }
    }
    EXPECT_EQ(tokens, solo.tokens);
  }
}

// A mask that allows nothing (the vocabulary cannot spell what the grammar needs; injected) fails
// its request alone with INTERNAL, on the device path and on the host path; the neighbour runs on.
TEST(ConstrainedGenerationTest, AMaskThatAllowsNothingFailsItsRequestAlone) {
  if (!kFaultInjection) GTEST_SKIP() << "built without fault injection";
  auto g = Compile(kWeather);
  for (const bool penalised_neighbour : {false, true}) {
    SCOPED_TRACE(penalised_neighbour ? "host" : "device");
    auto gen = Generator::Create(TestModelDir("llama3-f32"), GeneratorOptions{}).value();
    GenerationRequest neighbour = Constrained(nullptr, 9);
    neighbour.stopping.max_tokens = 6;
    if (penalised_neighbour) neighbour.sampling.repetition_penalty = 1.3f;
    const uint64_t free_id = gen->Add(neighbour).value();
    const uint64_t id = gen->Add(Constrained(g, 3)).value();
    ArmFault(Fault::kEmptyMask);
    absl::Status failed;
    FinishReason free_finish = FinishReason::kNone;
    std::vector<SequenceOutput> out;
    while (gen->HasWork()) {
      out.clear();
      ASSERT_TRUE(gen->Step(&out).ok());
      for (const SequenceOutput& o : out) {
        if (o.id == id && !o.error.ok()) failed = o.error;
        if (o.id == free_id && o.finish != FinishReason::kNone) free_finish = o.finish;
      }
    }
    DisarmFaults();
    EXPECT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
    EXPECT_NE(failed.message().find("allows no token"), std::string::npos) << failed;
    EXPECT_EQ(free_finish, FinishReason::kLength);
  }
}

// A constraint's pieces over the Llama 3 tokenizer.
class OutputConstraintTest : public ::testing::Test {
 protected:
  std::unique_ptr<Tokenizer> tokenizer_ =
      Tokenizer::FromDirectory(TestModelDir("llama3-f32")).value();
  const grammar::TokenTable table_ = GrammarTokenTable(*tokenizer_);
  grammar::TokenMasker masker_{table_};
  MaskCaches caches_;
};

// The end tokens are allowed exactly where the output can end, with their own logits; every
// token the grammar refuses is -inf, the others keep theirs.
TEST_F(OutputConstraintTest, EndTokensOnlyWhereTheOutputCanEnd) {
  auto g = Compile(R"({"enum": ["a"]})");
  const int32_t eos = *tokenizer_->eos_token_id();
  ConstraintSpec spec;
  spec.grammar = g;
  OutputConstraint c(spec, masker_, caches_, *tokenizer_, {eos});
  const auto vocab = static_cast<size_t>(tokenizer_->vocab_size()) + 7;  // padded past the table
  const int32_t quote = *tokenizer_->TokenToId("\"");
  const int32_t a = *tokenizer_->TokenToId("a");
  std::vector<float> logits(vocab, 0.5f);
  ASSERT_TRUE(c.Mask(absl::MakeSpan(logits)).ok());
  EXPECT_EQ(logits[quote], 0.5f);
  EXPECT_TRUE(std::isinf(logits[eos]));  // "" is not an answer
  EXPECT_TRUE(std::isinf(logits[a]));
  EXPECT_TRUE(std::isinf(logits[vocab - 1]));
  for (const int32_t token : {quote, a, quote}) ASSERT_TRUE(c.Accept(token).ok());
  EXPECT_TRUE(c.complete());
  logits.assign(vocab, 0.25f);
  ASSERT_TRUE(c.Mask(absl::MakeSpan(logits)).ok());
  EXPECT_EQ(logits[eos], 0.25f);
  EXPECT_EQ(std::count(logits.begin(), logits.end(), 0.25f), 1);
  EXPECT_FALSE(c.Accept(a).ok());  // refused by the grammar: INTERNAL, nothing taken
}

// The ids of `text` as the model would write it (no special tokens added).
std::vector<int32_t> Ids(const Tokenizer& tokenizer, std::string_view text) {
  EncodeOptions options;
  options.add_special_tokens = false;
  return tokenizer.Encode(text, options).value();
}

// How many logits Mask set to -inf.
int64_t Refused(OutputConstraint& c, size_t vocab) {
  std::vector<float> logits(vocab, 0.5f);
  EXPECT_TRUE(c.Mask(absl::MakeSpan(logits)).ok());
  return std::count_if(logits.begin(), logits.end(), [](float x) { return std::isinf(x); });
}

// A strict tool call the model opens itself: free text until the trigger (written here in
// several tokens), the grammar from there to the call object's end, free again after it.
TEST_F(OutputConstraintTest, ATriggeredGrammarHoldsFromTheTriggerToItsEnd) {
  ConstraintSpec spec;
  spec.ends_output = false;
  spec.trigger = "<tool_call>";
  spec.triggered = Compile(R"({"type": "object", "properties": {"days": {"type": "integer"}},
                               "required": ["days"]})");
  const auto vocab = static_cast<size_t>(tokenizer_->vocab_size());
  OutputConstraint c(spec, masker_, caches_, *tokenizer_, {*tokenizer_->eos_token_id()});
  for (const int32_t t : Ids(*tokenizer_, "Let me check.\n<tool_call>")) {
    EXPECT_FALSE(c.active());
    EXPECT_EQ(Refused(c, vocab), 0);  // free text: nothing masked
    ASSERT_TRUE(c.Accept(t).ok());
  }
  ASSERT_TRUE(c.active());
  EXPECT_GT(Refused(c, vocab), static_cast<int64_t>(vocab) / 2);
  for (const int32_t t : Ids(*tokenizer_, R"({"days": 3})")) ASSERT_TRUE(c.Accept(t).ok());
  EXPECT_FALSE(c.active());
  EXPECT_FALSE(c.complete());  // the answer goes on: the model closes the call
  EXPECT_EQ(Refused(c, vocab), 0);
  // A second call is held again.
  for (const int32_t t : Ids(*tokenizer_, "</tool_call>\n<tool_call>")) {
    ASSERT_TRUE(c.Accept(t).ok());
  }
  EXPECT_TRUE(c.active());
  EXPECT_FALSE(c.Accept(Ids(*tokenizer_, "x")[0]).ok());  // the grammar refuses it
}

// A forced call: held from the first token, free after its end, and the request goes on.
TEST_F(OutputConstraintTest, AForcedCallIsFreeAfterItsEnd) {
  ConstraintSpec spec;
  spec.grammar = Compile(R"({"enum": [1]})");
  spec.ends_output = false;
  OutputConstraint c(spec, masker_, caches_, *tokenizer_, {*tokenizer_->eos_token_id()});
  ASSERT_TRUE(c.active());
  ASSERT_TRUE(c.Accept(Ids(*tokenizer_, "1")[0]).ok());
  EXPECT_FALSE(c.active());
  EXPECT_FALSE(c.complete());
  EXPECT_TRUE(c.Accept(Ids(*tokenizer_, "x")[0]).ok());
}

// The logits Mask leaves finite, as a set of token ids.
std::vector<int32_t> Allowed(OutputConstraint& c, size_t vocab) {
  std::vector<float> logits(vocab, 0.5f);
  EXPECT_TRUE(c.Mask(absl::MakeSpan(logits)).ok());
  std::vector<int32_t> allowed;
  for (size_t id = 0; id < vocab; ++id) {
    if (!std::isinf(logits[id])) allowed.push_back(static_cast<int32_t>(id));
  }
  return allowed;
}

// The engine prepares a step's masks on the MaskWorker's thread while the forward pass runs. A
// prepared mask masks exactly as one computed at sampling time, and serves one token only: on a
// random walk through a schema's answers, `ahead` is prepared before every step, `inline` never;
// at every other step `ahead` is also prepared before the previous token was accepted, a mask
// for a state the matcher has since left, which must not be used.
TEST_F(OutputConstraintTest, MasksPreparedOnTheWorkerEqualMasksComputedAtSampling) {
  ConstraintSpec spec;
  spec.grammar = Compile(kWeather);
  const int32_t eos = *tokenizer_->eos_token_id();
  const auto vocab = static_cast<size_t>(tokenizer_->vocab_size());
  OutputConstraint ahead(spec, masker_, caches_, *tokenizer_, {eos});
  OutputConstraint at_sampling(spec, masker_, caches_, *tokenizer_, {eos});
  MaskWorker worker(masker_);
  std::mt19937 random(7);
  int steps = 0;
  for (; steps < 200 && !ahead.complete(); ++steps) {
    worker.Start({&ahead});
    worker.Wait();
    const std::vector<int32_t> expected = Allowed(at_sampling, vocab);
    ASSERT_FALSE(expected.empty());
    const int32_t token = expected[random() % expected.size()];
    if (steps % 2 == 1) {
      ASSERT_TRUE(ahead.Accept(token).ok());  // the prepared mask is now stale
    } else {
      ASSERT_EQ(Allowed(ahead, vocab), expected) << "step " << steps;
      ASSERT_TRUE(ahead.Accept(token).ok());
    }
    ASSERT_TRUE(at_sampling.Accept(token).ok());
    if (steps % 2 == 1 && !at_sampling.complete()) {
      ASSERT_EQ(Allowed(ahead, vocab), Allowed(at_sampling, vocab)) << "after step " << steps;
    }
  }
  EXPECT_GT(steps, 10);
}

// A grammar's cache is prepared before its first request starts: the preparer claims it, the
// request waits while it is claimed (MasksReady), and the request's steps then walk nothing
// costly (the string's characters were walked by the preparer). A second grammar queued while
// the preparer is busy is not ready until its own preparation ends.
TEST(ConstrainedGenerationTest, AGrammarIsPreparedBeforeItsFirstRequestStarts) {
  auto gen = Generator::Create(TestModelDir("llama3-f32"), GeneratorOptions{}).value();
  std::mutex mu;
  std::condition_variable cv;
  int prepared = 0;
  bool release = false;
  // Holds the preparer after each grammar until released: the second stays queued meanwhile.
  gen->SetOnMasksPrepared([&] {
    std::unique_lock lock(mu);
    ++prepared;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  });
  std::vector<GenerationRequest> requests{
      Constrained(Compile(kWeather), 1),
      Constrained(Compile(R"({"type": "object", "properties": {"note": {"type": "string",
          "minLength": 2, "maxLength": 40}}, "required": ["note"]})"),
                  2)};
  gen->PrepareMasks(requests[0]);
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return prepared == 1; });
  }
  EXPECT_TRUE(gen->MasksReady(requests[0]));
  gen->PrepareMasks(requests[1]);
  EXPECT_FALSE(gen->MasksReady(requests[1]));
  gen->PrepareMasks(requests[0]);  // prepared already: nothing queued
  {
    std::unique_lock lock(mu);
    release = true;
    cv.notify_all();
    cv.wait(lock, [&] { return prepared == 2; });
  }
  gen->SetOnMasksPrepared(nullptr);
  EXPECT_TRUE(gen->MasksReady(requests[1]));
  const auto results = gen->GenerateAll(requests).value();
  for (const auto& r : results) {
    if (r.finish != FinishReason::kStop) continue;
    EXPECT_TRUE(Json::accept(r.text)) << r.text;
  }
  EXPECT_EQ(gen->CostlyMaskWalksInSteps(), 0);
}

// The preparer's queue is bounded: while it is busy, at most MaskPreparer::kMaxQueued grammars
// wait; the next one is not claimed, and its request may start at once (its steps build its
// cache, as without preparation).
TEST(ConstrainedGenerationTest, AtMostMaxQueuedGrammarsWaitForThePreparer) {
  auto gen = Generator::Create(TestModelDir("llama3-f32"), GeneratorOptions{}).value();
  std::mutex mu;
  std::condition_variable cv;
  bool busy = false, release = false;
  gen->SetOnMasksPrepared([&] {  // holds the preparer after its first grammar
    std::unique_lock lock(mu);
    busy = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  });
  std::vector<GenerationRequest> requests;
  for (int i = 0; i <= static_cast<int>(MaskPreparer::kMaxQueued) + 1; ++i) {
    requests.push_back(Constrained(
        Compile(absl::StrCat(R"({"type": "string", "maxLength": )", i + 1, "}").c_str()), i));
  }
  gen->PrepareMasks(requests[0]);
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return busy; });
  }
  for (size_t i = 1; i < requests.size(); ++i) gen->PrepareMasks(requests[i]);
  for (size_t i = 1; i + 1 < requests.size(); ++i) EXPECT_FALSE(gen->MasksReady(requests[i])) << i;
  EXPECT_TRUE(gen->MasksReady(requests.back()));
  {
    std::lock_guard lock(mu);
    release = true;
    cv.notify_all();
  }
  gen->SetOnMasksPrepared([] {});  // the rest run through
}

// Without preparation, the steps walk the string themselves: what the test above rules out.
TEST(ConstrainedGenerationTest, WithoutPreparationTheStepsWalkTheStrings) {
  auto gen = Generator::Create(TestModelDir("llama3-f32"), GeneratorOptions{}).value();
  const auto g = Compile(kWeather);  // held: the count is of live grammars' caches
  ASSERT_TRUE(gen->GenerateAll({Constrained(g, 1)}).ok());
  EXPECT_GT(gen->CostlyMaskWalksInSteps(), 0);
}

// Requests that share a compiled grammar share its mask cache; the cache goes with the grammar.
// A prepared cache is the grammar's once its preparation ends; a grammar claimed for preparing
// is not claimed twice; a request that starts while it is prepared keeps the cache it got.
TEST(MaskCachesTest, APreparedCacheGoesToTheGrammarsRequests) {
  MaskCaches caches;
  auto g = Compile(kWeather);
  EXPECT_TRUE(caches.StartPreparing(g));
  EXPECT_FALSE(caches.StartPreparing(g));
  EXPECT_TRUE(caches.Preparing(g.get()));
  const auto prepared = std::make_shared<grammar::MaskCache>();
  caches.FinishPreparing(g.get(), prepared);
  EXPECT_FALSE(caches.Preparing(g.get()));
  EXPECT_EQ(caches.For(g), prepared);
  EXPECT_FALSE(caches.StartPreparing(g));  // it has a cache

  auto early = Compile(kWeather);
  ASSERT_TRUE(caches.StartPreparing(early));
  const auto started = caches.For(early);  // a request that did not wait
  EXPECT_FALSE(caches.Preparing(early.get()));  // nothing waits for a cache that will be dropped
  caches.FinishPreparing(early.get(), std::make_shared<grammar::MaskCache>());
  EXPECT_EQ(caches.For(early), started);
}

TEST(MaskCachesTest, OneCachePerGrammarWhileItLives) {
  MaskCaches caches;
  auto g = Compile(kWeather);
  const auto cache = caches.For(g);
  EXPECT_EQ(caches.For(g), cache);
  auto other = Compile(kWeather);  // the same schema compiled again: another grammar
  EXPECT_NE(caches.For(other), cache);
  g.reset();
  other.reset();
  auto third = Compile(R"({"type": "integer"})");
  caches.For(third);
  EXPECT_EQ(caches.size(), 1u);  // the freed grammars' caches are gone
}

}  // namespace
}  // namespace specula
