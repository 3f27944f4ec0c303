#include "tests/server/e2e/test_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "gtest/gtest.h"
#include "tests/engine/generate/greedy_request.h"

namespace specula::testing {

std::unique_ptr<Server> StartServer(const std::function<void(ServerConfig&)>& tweak) {
  ServerConfig config;
  config.model.path = TestModelDir();
  config.model.device = DeviceKind::kCpu;
  config.server.listen = "127.0.0.1:0";
  // Off unless a test scrapes it: no port is bound that the test does not use.
  config.server.metrics_listen = "";
  config.scheduler.threads = 1;
  if (tweak) tweak(config);
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(config);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

std::unique_ptr<v1::Specula::Stub> Connect(const std::string& address) {
  return v1::Specula::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

int ConnectTcp(const std::string& address, const std::string& source) {
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in from{};
  from.sin_family = AF_INET;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (inet_pton(AF_INET, source.c_str(), &from.sin_addr) == 1 &&
      bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) == 0 &&
      connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0) {
    return fd;
  }
  close(fd);
  return -1;
}

bool SendHttp2Preface(int fd) {
  static constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";
  constexpr ssize_t kBytes = sizeof(kPreface) - 1;
  return send(fd, kPreface, kBytes, MSG_NOSIGNAL) == kBytes;
}

bool ReadSettingsAck(int fd) {
  for (int frames = 0; frames < 16; ++frames) {
    uint8_t header[9];
    if (recv(fd, header, sizeof(header), MSG_WAITALL) != sizeof(header)) return false;
    const size_t length = (size_t{header[0]} << 16) | (size_t{header[1]} << 8) | header[2];
    if (header[3] == 0x4 && (header[4] & 0x1) != 0) return true;  // SETTINGS with ACK
    std::vector<uint8_t> payload(length);
    if (length > 0 &&
        recv(fd, payload.data(), length, MSG_WAITALL) != static_cast<ssize_t>(length)) {
      return false;
    }
  }
  return false;
}

StreamResult RunGenerate(
    v1::Specula::Stub& stub, const v1::GenerateRequest& request,
    const std::function<void(grpc::ClientContext&)>& setup,
    const std::function<void(grpc::ClientContext&, const v1::GenerateResponse&)>& on_message) {
  grpc::ClientContext ctx;
  if (setup) setup(ctx);
  StreamResult result;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader = stub.Generate(&ctx, request);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    ++result.messages;
    for (uint32_t t : msg.token_ids()) result.tokens.push_back(static_cast<int32_t>(t));
    result.text += msg.text();
    if (msg.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      result.finish = msg.finish_reason();
      result.usage = msg.usage();
    }
    if (msg.has_kv_stats()) result.kv_stats = msg.kv_stats();
    if (on_message) on_message(ctx, msg);
  }
  result.status = reader->Finish();
  return result;
}

v1::GenerateRequest GreedyIds(const std::vector<int32_t>& prompt, int max_tokens) {
  v1::GenerateRequest r;
  for (int32_t id : prompt) r.mutable_prompt_token_ids()->add_ids(static_cast<uint32_t>(id));
  r.mutable_sampling()->set_temperature(0);
  r.mutable_stopping()->set_max_tokens(max_tokens);
  r.mutable_stopping()->set_ignore_eos(true);
  return r;
}

GenerationResult Offline(const std::vector<int32_t>& prompt, int max_tokens) {
  GeneratorOptions options;
  options.threads = 1;
  auto generator = Generator::Create(TestModelDir(), options).value();
  return generator->GenerateAll({Greedy(prompt, max_tokens)}).value()[0];
}

std::vector<int32_t> PromptFor(int i) {
  std::vector<int32_t> prompt;
  for (int j = 0; j < 2 + (i * 7) % 23; ++j) prompt.push_back(1 + (i * 37 + j * 11) % 500);
  return prompt;
}

std::vector<StreamResult> RunHundredCancellingTen(
    Server& server, const std::function<v1::GenerateRequest(int i, int max_tokens)>& make_request) {
  constexpr int kStreams = 100;
  std::vector<StreamResult> results(kStreams);
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      auto stub = Connect(server.address());
      const v1::GenerateRequest request = make_request(i, MaxTokensOfHundred(i));
      if (CancelledOfHundred(i)) {
        // Long enough to be cancelled mid-way: the client cancels after its first tokens.
        results[i] = RunGenerate(*stub, request, {},
                                 [](grpc::ClientContext& ctx, const v1::GenerateResponse& m) {
                                   if (m.token_ids_size() > 0) ctx.TryCancel();
                                 });
      } else {
        results[i] = RunGenerate(*stub, request);
      }
    });
  }
  for (auto& t : clients) t.join();
  int cancelled_count = 0;
  for (int i = 0; i < kStreams; ++i) {
    if (CancelledOfHundred(i)) {
      EXPECT_EQ(results[i].status.error_code(), grpc::StatusCode::CANCELLED) << i;
      EXPECT_LT(results[i].tokens.size(), 3000u) << i;
      ++cancelled_count;
      continue;
    }
    EXPECT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens.size(), static_cast<size_t>(MaxTokensOfHundred(i))) << i;
  }
  EXPECT_EQ(cancelled_count, 10);
  EXPECT_TRUE(server.engine().WaitIdle(absl::Now() + absl::Seconds(60)));
  return results;
}

}  // namespace specula::testing
