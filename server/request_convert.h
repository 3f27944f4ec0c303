// The one place the server translates between the public API (specula.v1 protos) and the
// engine's structs (docs/ARCHITECTURE.md §2: the engine never sees protobuf types).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/grammar/answer_lead.h"
#include "engine/serve/engine.h"
#include "engine/serve/request_stream.h"
#include "engine/tokenizer/tokenizer.h"
#include "specula/v1/specula.pb.h"

namespace specula {

// Requests whose request_id is longer are INVALID_ARGUMENT (it goes into every log line).
inline constexpr size_t kMaxRequestIdBytes = 256;
// Session ids are 1 to this many printable ASCII bytes without spaces (they appear in logs and
// ListSessions).
inline constexpr size_t kMaxSessionIdBytes = 128;
// The session id as an HTTP header and as gRPC metadata: what a session-affine proxy hashes on.
inline constexpr char kSessionIdMetadata[] = "x-session-id";
absl::Status ValidateSessionId(absl::string_view id);

// Checks the request's shape (exactly one non-empty input, ids representable, request_id length),
// tokenizes `prompt`, and fills the engine request. Value checks that need the model (ids below
// the vocabulary, context length, sampling ranges) are the engine's, at Submit. Messages name the
// API field, e.g. "prompt_token_ids[2] = 4294967295 is outside the vocabulary".
// How many tokens (prompt + output) a request can hold, for the default output length.
struct TotalTokenLimits {
  int64_t dense = 0;   // min(model context, KV cache capacity)
  int64_t sparse = 0;  // min(model context, host KV store); 0 when the server has no sparse cache
  // Whether the engine would run this request sparse (Generator::UsesSparse); required when
  // `sparse` > 0.
  std::function<bool(const GenerationRequest&)> uses_sparse;
  // The operator's limits (server.limits; 0 = none): the longest prompt, and the largest
  // max_tokens, one request may ask for. Over either is INVALID_ARGUMENT naming the key; a request
  // without max_tokens gets at most max_output_tokens.
  int64_t max_prompt_tokens = 0;
  int64_t max_output_tokens = 0;
};

// An empty request_id gets a fresh one. Without stopping.max_tokens (one rule for every API,
// docs/SERVING.md) the request may generate what fits after its prompt in the limit of the path
// it runs on (`limits.sparse` if the engine runs it sparse with that length, else
// `limits.dense`), capped by `default_max_tokens` (scheduler.default_max_tokens; 0 = no cap) and
// limits.max_output_tokens: a client that did not ask for a length is not refused for one it did
// not choose, and a sparse request longer than the device KV cache is not cut to one token. A
// prompt that leaves no room gets 1, so the engine refuses it naming the limit it hit.
// What a rendered chat prompt tells the conversion (from RenderedChat).
struct ChatPromptFacts {
  // Byte ranges whose control-token text is the client's, tokenized as ordinary text.
  std::vector<std::pair<size_t, size_t>> plain_ranges;
  // Where the answer starts: the output constraint holds it after a reasoning model's block.
  grammar::AnswerLead answer_lead = grammar::AnswerLead::kNone;
};
absl::StatusOr<EngineRequest> ToEngineRequest(const v1::GenerateRequest& request,
                                              const Tokenizer& tokenizer,
                                              int32_t default_max_tokens,
                                              const TotalTokenLimits& limits,
                                              const ChatPromptFacts& chat = {});

// The tokenizing options a request asks for (GenerateRequest and TokenizeRequest name them alike):
// special tokens added unless add_special_tokens is false; split_special_tokens as given.
template <typename Request>
EncodeOptions EncodeOptionsOf(const Request& request) {
  EncodeOptions options;
  options.add_special_tokens = !request.has_add_special_tokens() || request.add_special_tokens();
  options.split_special_tokens = request.split_special_tokens();
  options.single_bos = true;  // docs/SERVING.md: never two BOS tokens
  return options;
}

// Tokenizes the text of `field` ("prompt", "text") as Generate would: stopping once it is longer
// than any request can be (max(limits.dense, limits.sparse) tokens) and refusing it by its size
// alone where the tokenizer makes that certain, either INVALID_ARGUMENT saying so.
// `options.max_tokens` is ignored.
absl::StatusOr<std::vector<int32_t>> EncodePrompt(const Tokenizer& tokenizer,
                                                  absl::string_view text, absl::string_view field,
                                                  EncodeOptions options,
                                                  const TotalTokenLimits& limits);

// A new request id: "req-" and 16 random hex digits.
std::string NewRequestId();

// Fills one stream message from what the engine produced since the last one. Sets finish_reason,
// usage and kv_stats when `chunk.done`.
void FillResponse(const StreamChunk& chunk, const std::string& request_id,
                  v1::GenerateResponse* response);

v1::FinishReason ToProtoFinishReason(FinishReason finish);

}  // namespace specula
