// End to end: every kind of bad input gets INVALID_ARGUMENT naming the field, a full queue gets
// RESOURCE_EXHAUSTED at once, oversized messages are refused; nothing is left queued or held.
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/e2e/test_server.h"

namespace specula::testing {
namespace {

using ::testing::HasSubstr;

struct BadCase {
  std::string name;
  std::function<void(v1::GenerateRequest&)> edit;
  std::string field;  // the message must mention it
};

std::vector<BadCase> BadCases() {
  return {
      {"no_input", [](auto& r) { r.clear_prompt_token_ids(); }, "no input"},
      {"two_inputs", [](auto& r) { r.set_prompt("hi"); }, "exactly one"},
      {"empty_prompt",
       [](auto& r) {
         r.clear_prompt_token_ids();
         r.set_prompt("");
       },
       "prompt is empty"},
      {"empty_ids", [](auto& r) { r.mutable_prompt_token_ids()->clear_ids(); },
       "prompt_token_ids is empty"},
      {"id_at_vocab", [](auto& r) { r.mutable_prompt_token_ids()->set_ids(1, 512); },
       "prompt_token_ids[1]"},
      {"id_beyond_int32", [](auto& r) { r.mutable_prompt_token_ids()->set_ids(0, 4000000000u); },
       "prompt_token_ids[0]"},
      {"beyond_context", [](auto& r) { r.mutable_stopping()->set_max_tokens(4095); }, "context"},
      {"zero_max_tokens", [](auto& r) { r.mutable_stopping()->set_max_tokens(0); },
       "stopping.max_tokens"},
      {"negative_temperature", [](auto& r) { r.mutable_sampling()->set_temperature(-1); },
       "sampling.temperature"},
      {"top_p_above_one", [](auto& r) { r.mutable_sampling()->set_top_p(1.5f); }, "sampling.top_p"},
      {"nan_min_p", [](auto& r) { r.mutable_sampling()->set_min_p(std::nanf("")); },
       "sampling.min_p"},
      {"negative_top_k", [](auto& r) { r.mutable_sampling()->set_top_k(-2); }, "sampling.top_k"},
      {"too_many_logprobs", [](auto& r) { r.mutable_sampling()->set_logprobs(21); },
       "sampling.logprobs must be in [0, 20] (unset = none), got 21"},
      {"negative_logprobs", [](auto& r) { r.mutable_sampling()->set_logprobs(-1); },
       "sampling.logprobs must be in [0, 20] (unset = none), got -1"},
      {"frequency_penalty", [](auto& r) { r.mutable_sampling()->set_frequency_penalty(3); },
       "sampling.frequency_penalty"},
      {"stop_token_at_vocab", [](auto& r) { r.mutable_stopping()->add_stop_token_ids(600); },
       "stopping.stop_token_ids"},
      {"long_request_id", [](auto& r) { r.set_request_id(std::string(300, 'x')); }, "request_id"},
      {"unknown_sparse_mode",
       [](auto& r) { r.mutable_sparse()->set_mode(static_cast<v1::SparseMode>(9)); },
       "sparse.mode"},
      {"budget_with_dense_mode",
       [](auto& r) {
         r.mutable_sparse()->set_mode(v1::SPARSE_MODE_DENSE);
         r.mutable_sparse()->set_budget_tokens(64);
       },
       "sparse.budget_tokens"},
  };
}

TEST(ErrorsE2eTest, EveryBadInputIsInvalidArgumentNamingTheField) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  for (const BadCase& c : BadCases()) {
    v1::GenerateRequest req = GreedyIds({1, 2, 3}, 4);
    c.edit(req);
    StreamResult got = RunGenerate(*stub, req);
    EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.name << ": " << got.status.error_message();
    EXPECT_THAT(got.status.error_message(), HasSubstr(c.field)) << c.name;
    EXPECT_EQ(got.messages, 0) << c.name;
  }
  EXPECT_EQ(server->engine().load().waiting, 0);
  EXPECT_EQ(server->engine().load().kv_blocks_used, 0);
  // The server is still healthy afterwards.
  EXPECT_TRUE(RunGenerate(*stub, GreedyIds({1, 2, 3}, 4)).status.ok());
}

TEST(ErrorsE2eTest, UnaryCallsRejectBadInput) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  v1::DetokenizeRequest dreq;
  dreq.add_token_ids(1);
  dreq.add_token_ids(999999);
  v1::DetokenizeResponse dres;
  grpc::ClientContext dctx;
  grpc::Status s = stub->Detokenize(&dctx, dreq, &dres);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("token_ids[1]"));
}

TEST(ErrorsE2eTest, OversizedRequestsAreRefused) {
  auto server = StartServer([](ServerConfig& c) { c.server.max_receive_message_bytes = 4096; });
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  v1::GenerateRequest req = GreedyIds({}, 4);
  req.clear_prompt_token_ids();
  req.set_prompt(std::string(5000, 'a'));
  StreamResult got = RunGenerate(*stub, req);
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(got.status.error_message(), HasSubstr("server.max_receive_message_bytes"));
  // Far beyond the limit gRPC refuses the message before it is buffered.
  req.set_prompt(std::string(20000, 'a'));
  got = RunGenerate(*stub, req);
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  v1::TokenizeRequest treq;
  treq.set_text(std::string(5000, 'a'));
  v1::TokenizeResponse tres;
  grpc::ClientContext tctx;
  EXPECT_EQ(stub->Tokenize(&tctx, treq, &tres).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// server.limits: a request exactly at a limit runs; one token past it is INVALID_ARGUMENT naming
// the key; a request that sets no max_tokens gets the cap, not scheduler.default_max_tokens.
TEST(ErrorsE2eTest, RequestsPastTheOperatorsLimitsAreRefusedNamingTheKey) {
  auto server = StartServer([](ServerConfig& c) {
    c.server.max_prompt_tokens = 8;
    c.server.max_output_tokens = 5;
  });
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  StreamResult at = RunGenerate(*stub, GreedyIds({1, 2, 3, 4, 5, 6, 7, 8}, 5));
  ASSERT_TRUE(at.status.ok()) << at.status.error_message();
  EXPECT_EQ(at.tokens.size(), 5u);

  StreamResult long_prompt = RunGenerate(*stub, GreedyIds({1, 2, 3, 4, 5, 6, 7, 8, 9}, 5));
  EXPECT_EQ(long_prompt.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(long_prompt.status.error_message(), HasSubstr("server.limits.max_prompt_tokens"));
  v1::GenerateRequest text = GreedyIds({}, 5);
  text.clear_prompt_token_ids();
  text.set_prompt(std::string(200, 'a') + " b c d e f g h i j k");  // far more than 8 tokens
  EXPECT_THAT(RunGenerate(*stub, text).status.error_message(),
              HasSubstr("server.limits.max_prompt_tokens"));

  StreamResult many = RunGenerate(*stub, GreedyIds({1, 2, 3}, 6));
  EXPECT_EQ(many.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(many.status.error_message(), HasSubstr("server.limits.max_tokens"));

  v1::GenerateRequest unset = GreedyIds({1, 2, 3}, 1);
  unset.mutable_stopping()->clear_max_tokens();  // default_max_tokens is 256
  StreamResult capped = RunGenerate(*stub, unset);
  ASSERT_TRUE(capped.status.ok()) << capped.status.error_message();
  EXPECT_EQ(capped.tokens.size(), 5u);
  EXPECT_EQ(capped.finish, v1::LENGTH);
}

TEST(ErrorsE2eTest, FullQueueIsResourceExhaustedImmediately) {
  auto server = StartServer([](ServerConfig& c) {
    c.scheduler.max_running_requests = 1;
    c.scheduler.max_waiting_requests = 1;
  });
  ASSERT_NE(server, nullptr);
  // Paused, nothing is admitted, so the queue fills deterministically: one request may start
  // at the next step and one may wait.
  server->engine().SetPausedForTesting(true);
  std::vector<StreamResult> accepted(2);
  std::vector<std::thread> clients;
  for (int i = 0; i < 2; ++i) {
    clients.emplace_back([&, i] {
      auto stub = Connect(server->address());
      accepted[i] = RunGenerate(*stub, GreedyIds(PromptFor(i), 5));
    });
  }
  for (int spin = 0; server->engine().load().waiting < 2 && spin < 1000; ++spin) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(server->engine().load().waiting, 2);
  auto stub = Connect(server->address());
  const absl::Time start = absl::Now();
  StreamResult rejected = RunGenerate(*stub, GreedyIds(PromptFor(7), 5));
  EXPECT_EQ(rejected.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << rejected.status.error_message();
  EXPECT_THAT(rejected.status.error_message(), HasSubstr("queue is full"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "rejected at once, not after a wait";
  server->engine().SetPausedForTesting(false);
  for (auto& t : clients) t.join();
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(accepted[i].status.ok()) << accepted[i].status.error_message();
    EXPECT_EQ(accepted[i].tokens, Offline(PromptFor(i), 5).tokens);
  }
}

}  // namespace
}  // namespace specula::testing
