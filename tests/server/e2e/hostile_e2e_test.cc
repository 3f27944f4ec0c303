// End to end: what a hostile or careless client, probe or operator sends. Each test is the
// regression test of a crash or defect found that way: the server answers with the documented
// code, or refuses to start with an error naming the key, and keeps serving everyone else.
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/process_limits.h"
#include "tests/server/e2e/daemon.h"
#include "tests/server/e2e/test_server.h"
#include "tests/server/prometheus_scrape.h"

namespace specula::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Request(absl::string_view method, absl::string_view path) {
  return HttpRequestText(method, path, method == "POST" || method == "PUT" ? "{}" : "");
}

// A greedy stream running on its own thread while a test does something else.
struct BackgroundStream {
  BackgroundStream(const std::string& address, int max_tokens)
      : max_tokens(max_tokens), thread([this, address] {
          auto stub = Connect(address);
          result = RunGenerate(*stub, GreedyIds(PromptFor(7), this->max_tokens));
        }) {}
  // Joins; the stream must have delivered every token.
  void ExpectComplete() {
    thread.join();
    EXPECT_TRUE(result.status.ok()) << result.status.error_message();
    EXPECT_EQ(result.tokens.size(), static_cast<size_t>(max_tokens));
  }
  int max_tokens;
  StreamResult result;
  std::thread thread;
};

TEST(HostileE2eTest, MetricsPortAnswersAnyRequestAndTheServerLives) {
  auto server = StartServer([](ServerConfig& c) { c.server.metrics_listen = "127.0.0.1:0"; });
  ASSERT_NE(server, nullptr);
  const int port = server->metrics().metrics_port();
  BackgroundStream stream(server->address(), 400);
  // Each of these killed the server (SIGSEGV in civetweb's error page).
  struct Case {
    const char* method;
    const char* path;
    int status;
  };
  for (const Case& c :
       {Case{"GET", "/", 404}, Case{"GET", "/favicon.ico", 404}, Case{"GET", "/..", 404},
        Case{"HEAD", "/metrics", 200}, Case{"POST", "/metrics", 405}, Case{"PUT", "/metrics", 405},
        Case{"DELETE", "/metrics", 405}, Case{"GET", "/metrics", 200}}) {
    const std::string r = HttpExchange(port, Request(c.method, c.path));
    EXPECT_EQ(HttpStatus(r), c.status) << c.method << " " << c.path << ": " << r;
  }
  stream.ExpectComplete();
  EXPECT_THAT(ScrapeMetrics(port).errors, ::testing::IsEmpty());
}

TEST(HostileE2eTest, IdleMetricsConnectionsDoNotBlockAScrape) {
  RaiseOpenFileLimit();  // 500 connections, both ends in this process
  auto server = StartServer([](ServerConfig& c) { c.server.metrics_listen = "127.0.0.1:0"; });
  ASSERT_NE(server, nullptr);
  const int port = server->metrics().metrics_port();
  std::vector<int> held;
  for (int i = 0; i < 500; ++i) {
    const int fd = ConnectLoopback(port);
    ASSERT_GE(fd, 0);
    held.push_back(fd);
  }
  for (int i = 0; i < 10; ++i) {  // and some drip half a request
    const std::string partial = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
    ASSERT_GT(::send(held[i], partial.data(), partial.size(), MSG_NOSIGNAL), 0);
  }
  // Behind civetweb's two worker threads this timed out; the client waits 5 s at most.
  const std::string r = HttpExchange(port, Request("GET", "/metrics"), /*timeout_seconds=*/5);
  EXPECT_EQ(HttpStatus(r), 200);
  EXPECT_THAT(r, HasSubstr("specula_requests_total"));
  for (int fd : held) ::close(fd);
}

// Sends raw bytes as the request of `method` and returns the status.
grpc::Status RawCall(const std::string& address, const std::string& method,
                     const std::string& bytes) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/specula.v1.Specula/" + method, grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  return done.get_future().get();
}

TEST(HostileE2eTest, InvalidUtf8AndGarbageAreInvalidArgumentNamingTheFieldAndCounted) {
  auto server = StartServer([](ServerConfig& c) { c.server.metrics_listen = "127.0.0.1:0"; });
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  struct Case {
    std::function<void(v1::GenerateRequest&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](auto& r) {
         r.clear_prompt_token_ids();
         r.set_prompt("ok \xff");
       },
       "prompt: invalid UTF-8 at byte 3"},
      {[](auto& r) {
         r.mutable_stopping()->add_stop("fine");
         r.mutable_stopping()->add_stop("\xc0\xaf");
       },
       "stopping.stop[1]: invalid UTF-8 at byte 0"},
      {[](auto& r) { r.set_request_id("id-\xfe"); }, "request_id: invalid UTF-8"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest req = GreedyIds({1, 2, 3}, 4);
    c.edit(req);
    // The C++ client serializes invalid UTF-8 as it is (it only logs).
    StreamResult got = RunGenerate(*stub, req);
    EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << got.status.error_message();
    EXPECT_EQ(got.status.error_message().substr(0, c.message.size()), c.message);
  }
  v1::TokenizeRequest treq;
  treq.set_text("\xed\xa0\x80");  // a UTF-16 surrogate encoded as UTF-8
  v1::TokenizeResponse tres;
  grpc::ClientContext tctx;
  grpc::Status s = stub->Tokenize(&tctx, treq, &tres);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), StartsWith("text: invalid UTF-8"));

  // Bytes that are no protobuf message at all.
  const std::string garbage = "\xff\xff\xff\xff\x0f garbage";
  for (const char* method : {"Generate", "Tokenize", "Detokenize", "GetModelInfo"}) {
    grpc::Status st = RawCall(server->address(), method, garbage);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_THAT(st.error_message(), HasSubstr("is not a valid")) << method;
  }
  // The three Generate cases and the garbage Generate are counted like any rejection.
  Exposition m = ScrapeMetrics(server->metrics().metrics_port());
  EXPECT_EQ(m.Get("specula_requests_total{code=\"INVALID_ARGUMENT\",finish_reason=\"none\"}"), 4);
  EXPECT_TRUE(RunGenerate(*stub, GreedyIds({1, 2, 3}, 4)).status.ok());
}

TEST(HostileE2eTest, OverlongPromptsAreRefusedWithoutTokenizingEverythingOthersRun) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  // 16 prompts of 3.9 MB: refused by size alone (no token of this tokenizer covers more than a
  // few dozen bytes, the context is 4096 tokens).
  std::vector<std::thread> clients;
  std::vector<StreamResult> huge(16);
  for (int i = 0; i < 16; ++i) {
    clients.emplace_back([&, i] {
      auto stub = Connect(server->address());
      v1::GenerateRequest req = GreedyIds({}, 4);
      req.clear_prompt_token_ids();
      req.set_prompt(std::string(3900 * 1000, static_cast<char>('a' + i % 26)));
      huge[i] = RunGenerate(*stub, req);
    });
  }
  auto stub = Connect(server->address());
  // A prompt within the size bound that still encodes past the context: tokenizing stops there.
  v1::GenerateRequest spaced = GreedyIds({}, 4);
  spaced.clear_prompt_token_ids();
  std::string words;
  for (int i = 0; words.size() < 40000; ++i) absl::StrAppend(&words, "w", i % 10, " ");
  spaced.set_prompt(words);
  StreamResult long_prompt = RunGenerate(*stub, spaced);
  StreamResult small = RunGenerate(*stub, GreedyIds(PromptFor(1), 8));
  for (std::thread& t : clients) t.join();
  for (const StreamResult& r : huge) {
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(r.status.error_message(),
                HasSubstr("prompt: its 3900000 bytes encode to more than 4096 tokens"));
  }
  EXPECT_EQ(long_prompt.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(long_prompt.status.error_message(),
              HasSubstr("prompt: it encodes to more than 4096 tokens"));
  EXPECT_TRUE(small.status.ok()) << small.status.error_message();
  EXPECT_EQ(small.tokens, Offline(PromptFor(1), 8).tokens);
}

// Tests send text prompts over this many bytes to the tokenizer queue (the default, 16 KiB,
// is more tokens than the test model's context holds with its byte-sized vocabulary).
constexpr size_t kTestInlineTokenizeBytes = 100;

// A text prompt long enough for the tokenizer queue.
v1::GenerateRequest LongTextRequest(int max_tokens) {
  v1::GenerateRequest req = GreedyIds({}, max_tokens);
  req.clear_prompt_token_ids();
  req.set_prompt(std::string(200, 'a'));
  return req;
}

// Polls (up to 10 s) until the tokenizer queue holds `n` tasks.
bool WaitForQueued(Server& server, size_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (server.tokenizer_queue().outstanding() != n) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

TEST(HostileE2eTest, LongPromptsWaitForTheTokenizerQueueNotOnGrpcThreads) {
  auto server = StartServer([](ServerConfig& c) {
    c.server.metrics_listen = "127.0.0.1:0";
    c.scheduler.max_tokenizing_requests = 2;
  });
  ASSERT_NE(server, nullptr);
  server->SetInlineTokenizeBytesForTesting(kTestInlineTokenizeBytes);
  server->tokenizer_queue().SetPausedForTesting(true);
  StreamResult kept, abandoned;
  std::thread first, second;
  // Whatever fails below, the queue runs again and the clients are joined before the server goes.
  auto release = absl::MakeCleanup([&] {
    server->tokenizer_queue().SetPausedForTesting(false);
    if (first.joinable()) first.join();
    if (second.joinable()) second.join();
  });
  first = std::thread([&] {
    auto stub = Connect(server->address());
    kept = RunGenerate(*stub, LongTextRequest(4));
  });
  ASSERT_TRUE(WaitForQueued(*server, 1));
  // The second client gives up (its deadline passes) while its prompt waits in the queue.
  second = std::thread([&] {
    auto stub = Connect(server->address());
    abandoned = RunGenerate(*stub, LongTextRequest(4), [](grpc::ClientContext& ctx) {
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
    });
  });
  ASSERT_TRUE(WaitForQueued(*server, 2));
  auto stub = Connect(server->address());
  // The queue is full: a third long prompt is refused at once, naming the key.
  StreamResult refused = RunGenerate(*stub, LongTextRequest(4));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("scheduler.max_tokenizing_requests"));
  // Short requests do not wait behind the long ones.
  StreamResult small = RunGenerate(*stub, GreedyIds(PromptFor(1), 8));
  EXPECT_TRUE(small.status.ok()) << small.status.error_message();
  v1::GenerateRequest short_text = GreedyIds({}, 4);
  short_text.clear_prompt_token_ids();
  short_text.set_prompt("a short text prompt");
  EXPECT_TRUE(RunGenerate(*stub, short_text).status.ok());
  // Session calls carry no prompt: they do not queue behind prompts (they once got
  // RESOURCE_EXHAUSTED "... long prompts are already waiting to be tokenized").
  {
    grpc::ClientContext ctx;
    v1::DeleteSessionRequest del;
    del.set_session_id("no-such-session");
    v1::DeleteSessionResponse ignored;
    EXPECT_EQ(stub->DeleteSession(&ctx, del, &ignored).error_code(), grpc::StatusCode::NOT_FOUND);
    grpc::ClientContext list_ctx;
    v1::ListSessionsResponse sessions;
    EXPECT_TRUE(stub->ListSessions(&list_ctx, v1::ListSessionsRequest(), &sessions).ok());
  }
  second.join();
  EXPECT_EQ(abandoned.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << abandoned.status.error_message();
  // The server learns of it a moment after the client (its own deadline timer, or the client's
  // reset, whichever comes first).
  const auto seen_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (server->calls_gone_before_submit() == 0 && std::chrono::steady_clock::now() < seen_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_EQ(server->calls_gone_before_submit(), 1);
  // Released now, the abandoned call is answered without being tokenized or submitted.
  server->tokenizer_queue().SetPausedForTesting(false);
  first.join();
  EXPECT_TRUE(kept.status.ok()) << kept.status.error_message();
  EXPECT_EQ(kept.tokens.size(), 4u);
  ASSERT_TRUE(server->tokenizer_queue().WaitIdle(absl::Now() + absl::Seconds(10)));
  Exposition m = ScrapeMetrics(server->metrics().metrics_port());
  // Refused before the engine: finish_reason "none" (had the engine run it, "cancelled"). The
  // code is DEADLINE_EXCEEDED, or CANCELLED when the client's reset reached the server before
  // the server's own deadline passed.
  auto count = [&](const char* code, const char* finish) {
    const double v = m.Get(
        absl::StrCat("specula_requests_total{code=\"", code, "\",finish_reason=\"", finish, "\"}"));
    return std::isnan(v) ? 0.0 : v;
  };
  EXPECT_EQ(count("DEADLINE_EXCEEDED", "none") + count("CANCELLED", "none"), 1);
  EXPECT_EQ(count("DEADLINE_EXCEEDED", "cancelled") + count("CANCELLED", "cancelled"), 0);
  EXPECT_EQ(m.Get("specula_requests_total{code=\"RESOURCE_EXHAUSTED\",finish_reason=\"none\"}"), 1);
}

TEST(HostileE2eTest, DrainWaitsForPromptsBeingTokenized) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  server->SetInlineTokenizeBytesForTesting(kTestInlineTokenizeBytes);
  server->tokenizer_queue().SetPausedForTesting(true);
  StreamResult accepted;
  std::thread client, drain;
  auto release = absl::MakeCleanup([&] {
    server->tokenizer_queue().SetPausedForTesting(false);
    if (drain.joinable()) drain.join();
    if (client.joinable()) client.join();
  });
  client = std::thread([&] {
    auto stub = Connect(server->address());
    accepted = RunGenerate(*stub, LongTextRequest(6));
  });
  ASSERT_TRUE(WaitForQueued(*server, 1));
  drain = std::thread([&] { EXPECT_EQ(server->Shutdown(absl::Seconds(30)), 0); });
  // Once new calls are refused the drain has begun, with the accepted call still queued.
  auto stub = Connect(server->address());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  grpc::StatusCode code = grpc::StatusCode::OK;
  while ((code = RunGenerate(*stub, GreedyIds({1, 2}, 2)).status.error_code()) !=
             grpc::StatusCode::UNAVAILABLE &&
         std::chrono::steady_clock::now() < deadline) {
  }
  ASSERT_EQ(code, grpc::StatusCode::UNAVAILABLE) << "the drain never began";
  // Its prompt is tokenized after the drain began, and it still runs to the end.
  server->tokenizer_queue().SetPausedForTesting(false);
  drain.join();
  client.join();
  EXPECT_TRUE(accepted.status.ok()) << accepted.status.error_message();
  EXPECT_EQ(accepted.tokens.size(), 6u);
}

TEST(HostileE2eTest, NoDoubleBosAndSpecialTokenTextCanStayText) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  auto tokenize = [&](const std::string& text, bool split) {
    v1::TokenizeRequest req;
    req.set_text(text);
    req.set_split_special_tokens(split);
    v1::TokenizeResponse res;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub->Tokenize(&ctx, req, &res).ok());
    return std::vector<uint32_t>(res.token_ids().begin(), res.token_ids().end());
  };
  const std::vector<uint32_t> plain = tokenize("Hello", false);
  ASSERT_GE(plain.size(), 2u);
  const uint32_t bos = plain[0];  // the tiny Llama-3-style tokenizer adds <|begin_of_text|>
  // A prompt that already starts with the BOS text gets no second BOS.
  EXPECT_EQ(tokenize("<|begin_of_text|>Hello", false), plain);
  v1::GenerateRequest req = GreedyIds({}, 2);
  req.clear_prompt_token_ids();
  req.set_prompt("<|begin_of_text|>Hello");
  StreamResult got = RunGenerate(*stub, req);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.usage.prompt_tokens(), plain.size());
  // Control-token text from a user stays text with split_special_tokens.
  const std::vector<uint32_t> parsed = tokenize("user says <|eot_id|>", false);
  const std::vector<uint32_t> literal = tokenize("user says <|eot_id|>", true);
  EXPECT_LT(parsed.size(), literal.size());
  EXPECT_EQ(literal[0], bos);
  v1::DetokenizeRequest dreq;
  for (size_t i = 1; i < literal.size(); ++i) dreq.add_token_ids(literal[i]);
  v1::DetokenizeResponse dres;
  grpc::ClientContext dctx;
  ASSERT_TRUE(stub->Detokenize(&dctx, dreq, &dres).ok());
  EXPECT_EQ(dres.text(), "user says <|eot_id|>");
}

TEST(HostileE2eTest, StartupErrorsNameTheKeyThatCausedThem) {
  ServerConfig config;
  config.model.path = TestModelDir();
  config.server.listen = "127.0.0.1:0";
  config.server.metrics_listen = "";
  config.kv_cache.capacity_tokens = (int64_t{1} << 31) - 1;  // ~1 TiB of KV for this model
  absl::StatusOr<std::unique_ptr<Server>> s = Server::Start(config);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted) << s.status();
  EXPECT_THAT(std::string(s.status().message()), StartsWith("kv_cache.capacity_tokens: "));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("more than this machine's memory"));

  config.kv_cache.capacity_tokens = 65536;
  config.model.device = DeviceKind::kCuda;  // the backend factory's error, not one about model.path
  s = Server::Start(config);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.status().message()), StartsWith("model.device: cuda: "));
}

// A copy of the test model whose `file` (a JSON document) `edit` changes.
std::string EditedModel(const std::string& name, const std::string& file,
                        const std::function<void(nlohmann::json&)>& edit) {
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/specula-edited-", getpid(), "-", name);
  std::filesystem::remove_all(dir);
  std::filesystem::copy(TestModelDir(), dir, std::filesystem::copy_options::recursive);
  std::ifstream in(dir + "/" + file);
  nlohmann::json j = nlohmann::json::parse(in);
  in.close();
  edit(j);
  std::ofstream(dir + "/" + file, std::ios::trunc) << j.dump();
  return dir;
}

TEST(HostileE2eTest, ModelFilesWithOutOfRangeValuesAreStartupErrors) {
  struct Case {
    std::string name, file;
    std::function<void(nlohmann::json&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      // Aborted with std::bad_alloc.
      {"vocab-id", "tokenizer.json",
       [](nlohmann::json& j) { j["model"]["vocab"]["huge"] = 1 << 30; },
       "tokenizer.json: token \"huge\" has id 1073741824, outside the vocabulary [0, 512)"},
      {"added-id", "tokenizer.json",
       [](nlohmann::json& j) {
         j["added_tokens"].push_back({{"id", 1 << 30}, {"content", "<big>"}, {"special", true}});
       },
       "added token \"<big>\" has id 1073741824, outside the vocabulary [0, 512)"},
      // Were cut to 32 bits: a context of 0 or 100 tokens.
      {"context-2e62", "config.json",
       [](nlohmann::json& j) { j["max_position_embeddings"] = int64_t{1} << 62; },
       "max_position_embeddings: must be at most 1073741824"},
      {"context-2e32", "config.json",
       [](nlohmann::json& j) { j["max_position_embeddings"] = (int64_t{1} << 32) + 100; },
       "max_position_embeddings: must be at most 1073741824"},
  };
  for (const Case& c : cases) {
    ServerConfig config;
    config.model.path = EditedModel(c.name, c.file, c.edit);
    config.server.listen = "127.0.0.1:0";
    config.server.metrics_listen = "";
    absl::StatusOr<std::unique_ptr<Server>> s = Server::Start(config);
    ASSERT_FALSE(s.ok()) << c.name;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(s.status().message()), StartsWith("model.path: ")) << c.name;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(c.message)) << c.name;
    std::filesystem::remove_all(config.model.path);
  }
}

std::string WriteConfig(const std::string& name, const std::string& yaml) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/specula-hostile-", getpid(), "-", name, ".yaml");
  std::ofstream(path, std::ios::trunc) << yaml;
  return path;
}

TEST(HostileE2eTest, DaemonRefusesBadConfigsWithExitOneNamingTheKey) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--config=/dev/zero"}, "not a regular file"},
      {{"--config=" + WriteConfig("tokens", "server:\n  auth:\n    token_file: /dev/zero\n")},
       "server.auth.token_file '/dev/zero' is not a regular file"},
      {{"--config=" + WriteConfig("template", "model:\n  chat_template: /dev/zero\n")},
       "model.chat_template '/dev/zero' is not a regular file"},
      {{"--config=" + WriteConfig("cert",
                                  "server:\n  tls:\n    cert_file: /dev/zero\n"
                                  "    key_file: /dev/zero\n")},
       "'/dev/zero' is not a regular file"},
      {{"--config=" + WriteConfig("threads", "scheduler:\n  threads: 100000\n")},
       "scheduler.threads: must be <= 1024, got 100000"},
      {{"--config=" + WriteConfig("running", "scheduler:\n  max_running_requests: 2147483647\n")},
       "scheduler.max_running_requests: must be <= 4096"},
      {{"--config=" + WriteConfig("kv", "kv_cache:\n  capacity_tokens: 17179869184\n")},
       "kv_cache.capacity_tokens: must be <= 2147483647"},
      // Flags override keys through the same table: the message names the flag and the key.
      {{"--device=gpu"}, "--device: model.device: must be one of cpu, cuda, auto, got 'gpu'"},
      {{"--log-level=loud"}, "--log-level: server.log_level: invalid log level 'loud'"},
      {{"--metrics-listen=nohost"}, "server.metrics_listen: invalid address 'nohost'"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    args.push_back("--model=" + TestModelDir());
    args.push_back("--listen=127.0.0.1:0");
    auto daemon = Daemon::Start(args);
    EXPECT_TRUE(daemon->address().empty());
    EXPECT_EQ(daemon->Wait(), 1) << daemon->Log();
    EXPECT_THAT(daemon->Log(), HasSubstr("event=startup_failed"));
    EXPECT_THAT(daemon->Log(), HasSubstr(c.message));
  }
}

// Runs a daemon on the test model with `config_path`, streaming `tokens` tokens; while the stream
// runs, `during` does what the test wants with the daemon.
struct SignalRun {
  std::unique_ptr<Daemon> daemon;
  StreamResult stream;
};
SignalRun RunWithSignal(const std::string& config_path, int tokens,
                        const std::function<void(Daemon&)>& during) {
  SignalRun run;
  run.daemon =
      Daemon::Start({"--config=" + config_path, "--model=" + TestModelDir(), "--listen=127.0.0.1:0",
                     "--metrics-listen=127.0.0.1:0", "--device=cpu"});
  if (run.daemon->address().empty()) return run;
  auto stub = Connect(run.daemon->address());
  bool done = false;
  run.stream = RunGenerate(*stub, GreedyIds(PromptFor(4), tokens), {},
                           [&](grpc::ClientContext&, const v1::GenerateResponse&) {
                             if (!done) during(*run.daemon);
                             done = true;
                           });
  return run;
}

TEST(HostileE2eTest, SighupReloadsTheLogLevelAndKeepsServing) {
  const std::string config = WriteConfig("hup", "server:\n  log_level: warning\n");
  SignalRun run = RunWithSignal(config, 600, [&](Daemon& d) {
    // Now info, and a change that needs a restart.
    std::ofstream(config, std::ios::trunc)
        << "server:\n  log_level: info\nscheduler:\n  max_running_requests: 3\n";
    kill(d.pid(), SIGHUP);
  });
  ASSERT_FALSE(run.daemon->address().empty()) << run.daemon->Log();
  EXPECT_TRUE(run.stream.status.ok()) << run.stream.status.error_message();
  EXPECT_EQ(run.stream.tokens.size(), 600u);
  ASSERT_TRUE(run.daemon->WaitForLogLine("event=config_reloaded")) << run.daemon->Log();
  // Still serving after the signal; its request is logged at the reloaded level (info).
  auto stub = Connect(run.daemon->address());
  EXPECT_TRUE(RunGenerate(*stub, GreedyIds(PromptFor(5), 4)).status.ok());
  EXPECT_TRUE(run.daemon->Running());
  kill(run.daemon->pid(), SIGTERM);
  EXPECT_EQ(run.daemon->Wait(), 0);
  const std::string log = run.daemon->Log();
  EXPECT_THAT(log, HasSubstr("event=config_reloaded log_level=info needs_restart=scheduler"));
  EXPECT_THAT(log, HasSubstr("event=request_finished"));

  // A configuration that no longer loads changes nothing.
  std::ofstream(config, std::ios::trunc) << "server:\n  log_level: warning\n";
  run = RunWithSignal(config, 300, [&](Daemon& d) {
    std::ofstream(config, std::ios::trunc) << "server: [broken\n";
    kill(d.pid(), SIGHUP);
  });
  EXPECT_TRUE(run.stream.status.ok()) << run.stream.status.error_message();
  // Before SIGTERM: two signals in flight may be handled on two threads in either order.
  EXPECT_TRUE(run.daemon->WaitForLogLine("event=config_reload_failed")) << run.daemon->Log();
  EXPECT_TRUE(run.daemon->Running());
  kill(run.daemon->pid(), SIGTERM);
  EXPECT_EQ(run.daemon->Wait(), 0);
  std::filesystem::remove(config);
}

TEST(HostileE2eTest, Sigusr1LogsTheStateAndSigquitDrains) {
  const std::string config = WriteConfig("usr", "server:\n  log_level: warning\n");
  SignalRun run = RunWithSignal(config, 800, [](Daemon& d) {
    kill(d.pid(), SIGUSR1);
    // Pending signals are delivered lowest number first (QUIT before USR1): wait for the state.
    EXPECT_TRUE(d.WaitForLogLine("event=state"));
    kill(d.pid(), SIGQUIT);  // drains like SIGTERM: the stream in flight completes
  });
  ASSERT_FALSE(run.daemon->address().empty());
  EXPECT_TRUE(run.stream.status.ok()) << run.stream.status.error_message();
  EXPECT_EQ(run.stream.tokens.size(), 800u);
  EXPECT_EQ(run.daemon->Wait(), 0) << run.daemon->Log();
  const std::string log = run.daemon->Log();
  // (Whether the stream is still running when the signal is handled depends on scheduling.)
  EXPECT_THAT(log,
              ::testing::ContainsRegex("event=state running=[01] waiting=0 kv_blocks_used=[0-9]+ "
                                       "kv_blocks_total=4096"));
  std::filesystem::remove(config);
}

}  // namespace
}  // namespace specula::testing

namespace specula::testing {
namespace {

// A channel whose client pings every `ping_ms`, with or without calls.
std::shared_ptr<grpc::Channel> PingingChannel(const std::string& address, int ping_ms) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, ping_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);  // ping even with no data sent
  args.SetInt(GRPC_ARG_HTTP2_MIN_SENT_PING_INTERVAL_WITHOUT_DATA_MS, ping_ms);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // its own connection, not a shared one
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

bool ModelInfoOk(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ModelInfo info;
  return v1::Specula::NewStub(channel)->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok();
}

// Whether `channel` leaves READY before `wait` is over.
bool LosesConnectionWithin(const std::shared_ptr<grpc::Channel>& channel,
                           std::chrono::milliseconds wait) {
  return channel->WaitForStateChange(GRPC_CHANNEL_READY, std::chrono::system_clock::now() + wait);
}

// server.connections: a client pinging (with no call) more often than min_ping_interval_seconds
// gets GOAWAY after max_ping_strikes strikes; a client that does not ping keeps its connection.
// gRPC clients ping at most once a second (their own floor), so the flood here is one ping a
// second against an allowed interval of 5 s.
TEST(HostileE2eTest, ClientsPingingTooOftenGetGoawayOthersKeepTheirConnections) {
  auto server = StartServer([](ServerConfig& c) {
    c.server.min_ping_interval_seconds = 5;
    c.server.max_ping_strikes = 2;
  });
  ASSERT_NE(server, nullptr);
  auto quiet = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  auto flood = PingingChannel(server->address(), 10);
  ASSERT_TRUE(ModelInfoOk(quiet));
  ASSERT_TRUE(ModelInfoOk(flood));
  EXPECT_TRUE(LosesConnectionWithin(flood, std::chrono::seconds(15)))
      << "the pinging client kept its connection";
  EXPECT_EQ(quiet->GetState(false), GRPC_CHANNEL_READY);
  EXPECT_TRUE(ModelInfoOk(quiet));
}

// The same client is welcome where pings are allowed every 0.5 s: the setting is the server's,
// not gRPC's default (5 minutes, which would send it away after three pings).
TEST(HostileE2eTest, ClientsPingingAtTheAllowedIntervalKeepTheirConnections) {
  auto server = StartServer([](ServerConfig& c) {
    c.server.min_ping_interval_seconds = 0.5;
    c.server.max_ping_strikes = 2;
  });
  ASSERT_NE(server, nullptr);
  auto polite = PingingChannel(server->address(), 10);
  ASSERT_TRUE(ModelInfoOk(polite));
  EXPECT_FALSE(LosesConnectionWithin(polite, std::chrono::milliseconds(4500)))
      << "a client pinging once a second lost its connection";
  EXPECT_TRUE(ModelInfoOk(polite));
}

// server.connections.grpc_max_idle_seconds: a connection with no call is closed (GOAWAY).
TEST(HostileE2eTest, IdleGrpcConnectionsAreClosed) {
  auto server = StartServer([](ServerConfig& c) { c.server.grpc_max_idle_seconds = 0.3; });
  ASSERT_NE(server, nullptr);
  auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  ASSERT_TRUE(ModelInfoOk(channel));
  EXPECT_TRUE(channel->WaitForStateChange(
      GRPC_CHANNEL_READY, std::chrono::system_clock::now() + std::chrono::seconds(10)))
      << "the idle connection stayed open";
  EXPECT_TRUE(ModelInfoOk(channel)) << "the client reconnects on its next call";
}

}  // namespace
}  // namespace specula::testing
