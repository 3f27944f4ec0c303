// End to end over loopback gRPC: streamed output equals the offline engine, under concurrency,
// with cancellations and deadlines, and every KV block comes back.
#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/e2e/test_server.h"
#include "tests/server/prometheus_scrape.h"

namespace specula::testing {
namespace {

using ::testing::HasSubstr;

void ExpectKvReturned(Server& server) {
  ASSERT_TRUE(server.engine().WaitIdle(absl::Now() + absl::Seconds(30)));
  EXPECT_EQ(server.engine().load().kv_blocks_used, 0);
  EXPECT_EQ(server.engine().load().running, 0);
  EXPECT_EQ(server.engine().load().waiting, 0);
}

TEST(GenerateE2eTest, StreamEqualsTheOfflineEngine) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  const std::vector<int32_t> prompt = PromptFor(3);
  StreamResult got = RunGenerate(*stub, GreedyIds(prompt, 24));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  GenerationResult want = Offline(prompt, 24);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.text, want.text);
  EXPECT_EQ(got.finish, v1::LENGTH);
  EXPECT_EQ(got.usage.prompt_tokens(), prompt.size());
  EXPECT_EQ(got.usage.completion_tokens(), 24u);
}

TEST(GenerateE2eTest, TextPromptIsTokenizedByTheServer) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  v1::TokenizeRequest treq;
  treq.set_text("Hello, specula!");
  v1::TokenizeResponse tres;
  grpc::ClientContext tctx;
  ASSERT_TRUE(stub->Tokenize(&tctx, treq, &tres).ok());
  ASSERT_GT(tres.token_ids_size(), 1);
  EXPECT_EQ(tres.tokens_size(), tres.token_ids_size());

  v1::GenerateRequest req = GreedyIds({}, 12);
  req.clear_prompt_token_ids();
  req.set_prompt("Hello, specula!");
  StreamResult got = RunGenerate(*stub, req);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  std::vector<int32_t> ids(tres.token_ids().begin(), tres.token_ids().end());
  EXPECT_EQ(got.tokens, Offline(ids, 12).tokens);

  v1::DetokenizeRequest dreq;
  for (int32_t t : got.tokens) dreq.add_token_ids(static_cast<uint32_t>(t));
  v1::DetokenizeResponse dres;
  grpc::ClientContext dctx;
  ASSERT_TRUE(stub->Detokenize(&dctx, dreq, &dres).ok());
  EXPECT_EQ(dres.text(), got.text);
}

TEST(GenerateE2eTest, DefaultMaxTokensIsCutToTheContext) {
  auto server = StartServer();  // default_max_tokens 256, context 4096
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  std::vector<int32_t> prompt(4090, 7);
  v1::GenerateRequest req = GreedyIds(prompt, 1);
  req.mutable_stopping()->clear_max_tokens();
  StreamResult got = RunGenerate(*stub, req);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens.size(), 6u);
  EXPECT_EQ(got.finish, v1::LENGTH);
  // An explicit max_tokens that does not fit is still the client's error.
  req.mutable_stopping()->set_max_tokens(7);
  EXPECT_EQ(RunGenerate(*stub, req).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// The same rule over HTTP: a completion of 4,095 prompt tokens that names no max_tokens gets the
// one token of room left (it was refused: "stopping.max_tokens (16) exceeds the model's
// context"), and a short one is not cut to OpenAI's 16.
TEST(GenerateE2eTest, HttpRequestsWithoutMaxTokensGetTheRemainingContext) {
  auto server = StartServer([](ServerConfig& c) {
    c.server.http_listen = "127.0.0.1:0";
    c.scheduler.default_max_tokens = 40;
  });
  ASSERT_NE(server, nullptr);
  const int http = std::stoi(server->http_address().substr(server->http_address().rfind(':') + 1));
  auto completion = [&](int prompt_tokens) {
    std::string ids;
    for (int i = 0; i < prompt_tokens; ++i) absl::StrAppend(&ids, i ? "," : "", 7);
    const std::string body = absl::StrCat(R"({"model": ")", server->served_model_name(),
                                          R"(", "prompt": [)", ids, R"(], "ignore_eos": true})");
    return HttpExchange(http, HttpRequestText("POST", "/v1/completions", body), 60);
  };
  const std::string full = completion(4095);
  ASSERT_EQ(HttpStatus(full), 200) << full;
  EXPECT_THAT(HttpBody(full), HasSubstr(R"("completion_tokens":1)"));
  EXPECT_THAT(HttpBody(full), HasSubstr(R"("finish_reason":"length")"));
  const std::string small = completion(3);
  ASSERT_EQ(HttpStatus(small), 200) << small;
  EXPECT_THAT(HttpBody(small), HasSubstr(R"("completion_tokens":40)"));  // the operator's cap
}

TEST(GenerateE2eTest, ThirtyTwoConcurrentStreamsEachMatchTheirSoloRun) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  constexpr int kStreams = 32;
  std::vector<StreamResult> results(kStreams);
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      auto stub = Connect(server->address());
      results[i] = RunGenerate(*stub, GreedyIds(PromptFor(i), 8 + i % 17));
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    GenerationResult want = Offline(PromptFor(i), 8 + i % 17);
    EXPECT_EQ(results[i].tokens, want.tokens) << "stream " << i;
    EXPECT_EQ(results[i].text, want.text) << "stream " << i;
  }
  ExpectKvReturned(*server);
}

TEST(GenerateE2eTest, CancellingTenOfAHundredLeavesTheOthersExactAndFreesEveryBlock) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  std::vector<StreamResult> results = RunHundredCancellingTen(
      *server, [](int i, int max_tokens) { return GreedyIds(PromptFor(i), max_tokens); });
  for (int i = 0; i < static_cast<int>(results.size()); ++i) {
    if (CancelledOfHundred(i) || !results[i].status.ok()) continue;
    EXPECT_EQ(results[i].tokens, Offline(PromptFor(i), MaxTokensOfHundred(i)).tokens)
        << "stream " << i;
  }
  ExpectKvReturned(*server);
}

TEST(GenerateE2eTest, DeadlineEndsTheStreamAndFreesItsBlocks) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  StreamResult got = RunGenerate(*stub, GreedyIds(PromptFor(1), 4000), [](grpc::ClientContext& c) {
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(50));
  });
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << got.status.error_message();
  EXPECT_LT(got.tokens.size(), 4000u);
  ExpectKvReturned(*server);
}

TEST(GenerateE2eTest, SlowReaderGetsEveryTokenInOrder) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  // The engine keeps generating while the client sleeps; whatever piles up meanwhile goes out
  // coalesced (how much depends on transport buffering, so only order and content are checked
  // here; RequestStreamTest checks the coalescing itself).
  StreamResult got = RunGenerate(*stub, GreedyIds(PromptFor(5), 200), {},
                                 [](grpc::ClientContext&, const v1::GenerateResponse&) {
                                   std::this_thread::sleep_for(std::chrono::milliseconds(5));
                                 });
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens, Offline(PromptFor(5), 200).tokens);
  EXPECT_LE(got.messages, 201);
}

// A client that never reads (issue 15's fault): its answer (about 1.5 MB with 20 logprobs per
// token, far beyond the transport's flow-control windows) cannot be sent, yet the engine
// finishes its generation and frees its KV and running slot while the call stays open, and
// other clients are served exactly meanwhile. Cancelling the call then ends it.
TEST(GenerateE2eTest, AClientThatNeverReadsHoldsNoKvAndDelaysNoOne) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  v1::GenerateRequest big = GreedyIds(PromptFor(7), 2000);
  big.mutable_sampling()->set_logprobs(20);
  grpc::ClientContext never_reads;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub->Generate(&never_reads, big);
  // Generation ends at the engine (KV and slot freed) although nothing was read: all 2000
  // decode steps ran.
  for (int spin = 0; server->engine().load().steps < 2000 && spin < 15000; ++spin) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_GE(server->engine().load().steps, 2000u);
  ExpectKvReturned(*server);
  // Others are served, exactly, while that call is still open.
  for (int i = 0; i < 3; ++i) {
    StreamResult got = RunGenerate(*stub, GreedyIds(PromptFor(i), 16));
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.tokens, Offline(PromptFor(i), 16).tokens);
  }
  never_reads.TryCancel();
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  ExpectKvReturned(*server);
}

}  // namespace
}  // namespace specula::testing
