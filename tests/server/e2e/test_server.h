// Helpers for end-to-end tests: a real Server on an ephemeral loopback port, a gRPC client, and
// the offline engine to compare against.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/generate/generator.h"
#include "grpcpp/grpcpp.h"
#include "server/server.h"
#include "specula/v1/specula.grpc.pb.h"

namespace specula::testing {

inline std::string TestModelDir() {
  return std::string(SPECULA_TEST_MODELS_DIR) + "/llama3-f32";
}

// Starts a server on 127.0.0.1:0 serving the llama3-f32 test model, without the metrics endpoint;
// `tweak` edits the config first.
std::unique_ptr<Server> StartServer(const std::function<void(ServerConfig&)>& tweak = {});

std::unique_ptr<v1::Specula::Stub> Connect(const std::string& address);

// Opens a bare TCP connection to "127.0.0.1:PORT" from loopback address `source` (127.0.0.1 by
// default; others spread many connections over more ports than one address has); -1 when it
// cannot.
int ConnectTcp(const std::string& address, const std::string& source = "127.0.0.1");

// Sends the client's HTTP/2 connection preface and an empty SETTINGS frame on a connection from
// ConnectTcp; false when the server already closed it (no SIGPIPE).
bool SendHttp2Preface(int fd);

// Reads frames until the server acknowledges the client's SETTINGS: by then gRPC's transport for
// this connection is built and reading. False when the server closed the connection instead.
bool ReadSettingsAck(int fd);

// What one Generate stream delivered.
struct StreamResult {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::string text;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  v1::Usage usage;
  std::optional<v1::KvStats> kv_stats;  // from the last message, when it had them
  int messages = 0;
};

// Runs a Generate stream to its end. `on_message` (optional) sees every message with the
// context, e.g. to cancel after the first.
StreamResult RunGenerate(
    v1::Specula::Stub& stub, const v1::GenerateRequest& request,
    const std::function<void(grpc::ClientContext&)>& setup = {},
    const std::function<void(grpc::ClientContext&, const v1::GenerateResponse&)>& on_message =
        {});

// A greedy request over token ids that ignores EOS, so its length is exactly max_tokens.
v1::GenerateRequest GreedyIds(const std::vector<int32_t>& prompt, int max_tokens);

// The offline engine's greedy answer to the same request (a fresh Generator, one request).
GenerationResult Offline(const std::vector<int32_t>& prompt, int max_tokens);

// Distinct prompts for request i.
std::vector<int32_t> PromptFor(int i);

// The 10-of-100 cancellation scenario: 100 concurrent streams, of which the ten with
// CancelledOfHundred(i) ask for 3000 tokens and are cancelled by their client after their first
// tokens, the others ask for MaxTokensOfHundred(i). `make_request(i, max_tokens)` builds stream
// i's request. Checks that the cancelled ten end CANCELLED early and every other stream ends OK
// with exactly its max_tokens tokens, then waits until the engine is idle; returns every stream's
// result for checks of their content.
inline bool CancelledOfHundred(int i) { return i % 10 == 3; }
inline int MaxTokensOfHundred(int i) { return CancelledOfHundred(i) ? 3000 : 6 + i % 13; }
std::vector<StreamResult> RunHundredCancellingTen(
    Server& server, const std::function<v1::GenerateRequest(int i, int max_tokens)>& make_request);

}  // namespace specula::testing
