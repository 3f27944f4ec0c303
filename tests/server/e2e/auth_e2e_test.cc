// Bearer-token authentication end to end (server.auth.token_file): over gRPC and the OpenAI HTTP
// API, no token and a wrong token are refused (UNAUTHENTICATED / 401 in OpenAI's format), a
// listed token passes, and the health checks answer without one (orchestrator probes).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/common/build_info.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/server/e2e/daemon.h"
#include "tests/server/e2e/test_server.h"
#include "tests/server/prometheus_scrape.h"

namespace specula::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "agent-token-0123456789";

std::string WriteTokenFile() {
  char path[] = "/tmp/specula_auth_tokens_XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << kToken << "\n";
  return path;
}

std::string HttpRequestWith(const std::string& method, const std::string& path,
                            const std::string& authorization, const std::string& body = "") {
  std::string r = method + " " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n";
  if (!authorization.empty()) r += "Authorization: " + authorization + "\r\n";
  if (!body.empty()) {
    r += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n";
  }
  return r + "\r\n" + body;
}

int Port(const std::string& address) { return std::stoi(address.substr(address.rfind(':') + 1)); }

TEST(AuthE2eTest, OnlyABearerTokenGetsInButHealthAnswersEveryone) {
  const std::string tokens = WriteTokenFile();
  auto server = StartServer([&](ServerConfig& c) {
    c.server.auth_token_file = tokens;
    c.server.http_listen = "127.0.0.1:0";
  });
  ASSERT_NE(server, nullptr);
  auto stub = Connect(server->address());
  const v1::GenerateRequest request = GreedyIds({1, 2, 3, 4}, 2);
  auto with = [](std::string value) {
    return [value](grpc::ClientContext& ctx) { ctx.AddMetadata("authorization", value); };
  };
  StreamResult none = RunGenerate(*stub, request);
  EXPECT_EQ(none.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(none.status.error_message(), HasSubstr("bearer token"));
  EXPECT_EQ(RunGenerate(*stub, request, with("Bearer wrong-token-0123456789")).status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  StreamResult good = RunGenerate(*stub, request, with(std::string("Bearer ") + kToken));
  EXPECT_TRUE(good.status.ok()) << good.status.error_message();
  EXPECT_EQ(good.tokens.size(), 2u);
  // Unary methods too.
  {
    grpc::ClientContext ctx;
    v1::GetModelInfoRequest info_request;
    v1::ModelInfo info;
    EXPECT_EQ(stub->GetModelInfo(&ctx, info_request, &info).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  // The health service answers without a token.
  {
    auto health = grpc::health::v1::Health::NewStub(
        grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse res;
    ASSERT_TRUE(health->Check(&ctx, req, &res).ok());
    EXPECT_EQ(res.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  // HTTP: 401 in OpenAI's format without a token, 200 with it; /health needs none.
  const int http = Port(server->http_address());
  const std::string models = "/v1/models";
  const std::string refused = HttpExchange(http, HttpRequestWith("GET", models, ""));
  EXPECT_EQ(HttpStatus(refused), 401) << refused;
  EXPECT_THAT(HttpBody(refused), HasSubstr("\"error\""));
  EXPECT_EQ(HttpStatus(HttpExchange(http, HttpRequestWith("GET", models, "Bearer nope"))), 401);
  const std::string listed =
      HttpExchange(http, HttpRequestWith("GET", models, std::string("Bearer ") + kToken));
  EXPECT_EQ(HttpStatus(listed), 200);
  EXPECT_THAT(HttpBody(listed), HasSubstr(absl::StrCat("\"specula_version\":\"",
                                                       GetBuildInfo().version, "\"")));
  const std::string completion =
      R"({"model": ")" + server->served_model_name() + R"(", "prompt": "hi", "max_tokens": 2})";
  EXPECT_EQ(HttpStatus(HttpExchange(http, HttpRequestWith("POST", "/v1/completions", "",
                                                          completion))),
            401);
  EXPECT_EQ(HttpStatus(HttpExchange(http, HttpRequestWith("POST", "/v1/completions",
                                                          std::string("Bearer ") + kToken,
                                                          completion))),
            200);
  EXPECT_EQ(HttpStatus(HttpExchange(http, HttpRequestWith("GET", "/health", ""))), 200);
  // Issue 33: authentication comes before routing, so paths and methods cannot be enumerated
  // without a token (and no body is read).
  EXPECT_EQ(HttpStatus(HttpExchange(http, HttpRequestWith("GET", "/v1/nothing", ""))), 401);
  EXPECT_EQ(HttpStatus(HttpExchange(http, HttpRequestWith("DELETE", models, ""))), 401);
  EXPECT_EQ(HttpStatus(HttpExchange(
                http, HttpRequestWith("GET", "/v1/nothing", std::string("Bearer ") + kToken))),
            404);
  EXPECT_EQ(HttpStatus(HttpExchange(
                http, HttpRequestWith("DELETE", models, std::string("Bearer ") + kToken))),
            405);
  // Each of the five 401s above is counted (issue 33, item 7).
  const Exposition metrics = ParseExposition(server->metrics().Exposition());
  EXPECT_EQ(metrics.Get(R"(specula_http_refused_total{listener="openai",reason="unauthenticated"})"),
            5);
  std::remove(tokens.c_str());
}

// Waits (bounded) until `n` requests are queued in the paused engine.
bool WaitQueued(Server& server, int n) {
  for (int spin = 0; server.engine().load().waiting < n && spin < 5000; ++spin) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return server.engine().load().waiting == n;
}

// server.limits.max_requests_per_client: a client (its bearer token) with that many generations
// in flight gets RESOURCE_EXHAUSTED (HTTP 429) for one more; another client is not held back;
// the places come back when the requests end.
TEST(AuthE2eTest, EachClientHasItsOwnCapOfRequestsInFlight) {
  constexpr char kOther[] = "other-agent-token-0123456789";
  const std::string tokens = WriteTokenFile();
  std::ofstream(tokens, std::ios::app) << kOther << "\n";
  auto server = StartServer([&](ServerConfig& c) {
    c.server.auth_token_file = tokens;
    c.server.http_listen = "127.0.0.1:0";
    c.server.max_requests_per_client = 2;
  });
  ASSERT_NE(server, nullptr);
  const v1::GenerateRequest request = GreedyIds({1, 2, 3, 4}, 3);
  auto as = [](std::string token) {
    return [token](grpc::ClientContext& ctx) { ctx.AddMetadata("authorization", "Bearer " + token); };
  };
  // Two in flight (queued: the engine is paused), from threads.
  auto start_two = [&](std::vector<StreamResult>& results) {
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&, i] {
        auto stub = Connect(server->address());
        results[i] = RunGenerate(*stub, request, as(kToken));
      });
    }
    return threads;
  };
  server->engine().SetPausedForTesting(true);
  std::vector<StreamResult> first(2);
  std::vector<std::thread> threads = start_two(first);
  ASSERT_TRUE(WaitQueued(*server, 2));

  auto stub = Connect(server->address());
  StreamResult third = RunGenerate(*stub, request, as(kToken));
  EXPECT_EQ(third.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(third.status.error_message(), HasSubstr("server.limits.max_requests_per_client"));
  const std::string completion =
      R"({"model": ")" + server->served_model_name() + R"(", "prompt": "hi", "max_tokens": 2})";
  const int http = Port(server->http_address());
  const std::string refused = HttpExchange(
      http, HttpRequestWith("POST", "/v1/completions", std::string("Bearer ") + kToken, completion));
  EXPECT_EQ(HttpStatus(refused), 429) << refused;
  // Another client gets in.
  StreamResult other;
  threads.emplace_back([&] {
    auto other_stub = Connect(server->address());
    other = RunGenerate(*other_stub, request, as(kOther));
  });
  EXPECT_TRUE(WaitQueued(*server, 3));
  server->engine().SetPausedForTesting(false);
  for (auto& t : threads) t.join();
  for (const StreamResult& r : first) EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_TRUE(other.status.ok()) << other.status.error_message();

  // The places came back: two more in flight at once, and HTTP too.
  server->engine().SetPausedForTesting(true);
  std::vector<StreamResult> second(2);
  threads = start_two(second);
  EXPECT_TRUE(WaitQueued(*server, 2));
  server->engine().SetPausedForTesting(false);
  for (auto& t : threads) t.join();
  for (const StreamResult& r : second) EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  // HTTP requests give their places back too: three in a row under a cap of two.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(HttpStatus(HttpExchange(http, HttpRequestWith("POST", "/v1/completions",
                                                            std::string("Bearer ") + kToken,
                                                            completion))),
              200)
        << i;
  }
  std::remove(tokens.c_str());
}

// SIGHUP reads the token file again: a rotated token works at once and the old one is refused;
// a file that no longer loads keeps the tokens in use.
TEST(AuthE2eTest, SighupRotatesTheTokens) {
  const std::string tokens = WriteTokenFile();
  char config_path[] = "/tmp/specula_auth_config_XXXXXX";
  const int fd = mkstemp(config_path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(config_path) << "server:\n  auth:\n    token_file: \"" << tokens << "\"\n";
  auto daemon = Daemon::Start({"--config=" + std::string(config_path), "--model=" + TestModelDir(),
                               "--listen=127.0.0.1:0", "--metrics-listen="});
  ASSERT_FALSE(daemon->address().empty()) << daemon->Log();
  auto stub = Connect(daemon->address());
  auto generate_with = [&](const std::string& token) {
    return RunGenerate(*stub, GreedyIds({1, 2, 3}, 1), [token](grpc::ClientContext& ctx) {
             ctx.AddMetadata("authorization", "Bearer " + token);
           }).status.error_code();
  };
  EXPECT_EQ(generate_with(kToken), grpc::StatusCode::OK);
  const std::string rotated = "rotated-token-0123456789";
  std::ofstream(tokens, std::ios::trunc) << rotated << "\n";
  kill(daemon->pid(), SIGHUP);
  ASSERT_TRUE(daemon->WaitForLogLine("event=auth_reloaded")) << daemon->Log();
  EXPECT_EQ(generate_with(rotated), grpc::StatusCode::OK);
  EXPECT_EQ(generate_with(kToken), grpc::StatusCode::UNAUTHENTICATED);
  std::ofstream(tokens, std::ios::trunc) << "too short\n";
  kill(daemon->pid(), SIGHUP);
  ASSERT_TRUE(daemon->WaitForLogLine("event=auth_reload_failed")) << daemon->Log();
  EXPECT_EQ(generate_with(rotated), grpc::StatusCode::OK);
  // A path that names a device is refused at once, not read without end (it once was: the
  // process grew by 700 MB/s and SIGTERM went unanswered).
  std::remove(tokens.c_str());
  ASSERT_EQ(symlink("/dev/zero", tokens.c_str()), 0);
  kill(daemon->pid(), SIGHUP);
  ASSERT_TRUE(daemon->WaitForLogLine("is not a regular file")) << daemon->Log();
  EXPECT_EQ(generate_with(rotated), grpc::StatusCode::OK);
  kill(daemon->pid(), SIGTERM);
  EXPECT_EQ(daemon->Wait(), 0);
  std::remove(config_path);
  std::remove(tokens.c_str());
}

TEST(AuthE2eTest, ABadTokenFileStopsTheServerAtStartup) {
  ServerConfig config;
  config.server.listen = "127.0.0.1:0";
  config.server.metrics_listen = "";
  config.model.path = std::string(SPECULA_TEST_MODELS_DIR) + "/llama-f32";
  config.server.auth_token_file = "/nonexistent/specula-tokens";
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(config);
  EXPECT_FALSE(server.ok());
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("server.auth.token_file"));
}

}  // namespace
}  // namespace specula::testing
