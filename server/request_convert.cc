#include "server/request_convert.h"

#include <algorithm>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/status_macros.h"
#include "server/compiled_constraints.h"

namespace specula {
namespace {

absl::Status ConvertIds(const google::protobuf::RepeatedField<uint32_t>& ids,
                        absl::string_view field, std::vector<int32_t>* out) {
  out->reserve(ids.size());
  for (int i = 0; i < ids.size(); ++i) {
    // Ids above INT32_MAX cannot be vocabulary ids; catch them before the narrowing.
    if (ids[i] > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s[%d] = %d is outside the vocabulary", field, i, ids[i]));
    }
    out->push_back(static_cast<int32_t>(ids[i]));
  }
  return absl::OkStatus();
}

absl::Status ConvertSampling(const v1::SamplingParams& in, SamplingParams* out) {
  if (in.has_temperature()) out->temperature = in.temperature();
  if (in.has_top_p()) out->top_p = in.top_p();
  out->top_k = in.top_k();
  out->min_p = in.min_p();
  if (in.has_repetition_penalty()) out->repetition_penalty = in.repetition_penalty();
  out->frequency_penalty = in.frequency_penalty();
  out->presence_penalty = in.presence_penalty();
  if (in.has_seed()) out->seed = in.seed();
  if (in.has_logprobs()) {
    // Checked here in the API's terms: unset is "none" (the engine's -1).
    if (in.logprobs() < 0 || in.logprobs() > kMaxLogprobs) {
      return absl::InvalidArgumentError(
          absl::StrFormat("sampling.logprobs must be in [0, %d] (unset = none), got %d",
                          kMaxLogprobs, in.logprobs()));
    }
    out->logprobs = in.logprobs();
  }
  return absl::OkStatus();
}

absl::Status ConvertSparse(const v1::SparseOptions& in, SparseRequestOptions* out) {
  switch (in.mode()) {
    case v1::SPARSE_MODE_DEFAULT:
      out->mode = SparseMode::kDefault;
      break;
    case v1::SPARSE_MODE_DENSE:
      out->mode = SparseMode::kDense;
      break;
    case v1::SPARSE_MODE_SPARSE:
      out->mode = SparseMode::kSparse;
      break;
    default:
      // proto3 enums are open: a newer client's value arrives as a bare number.
      return absl::InvalidArgumentError(
          absl::StrFormat("sparse.mode = %d is not a SparseMode (0 DEFAULT, 1 DENSE, 2 SPARSE)",
                          static_cast<int>(in.mode())));
  }
  // Whether the budget fits the mode and the server is the engine's to say (Generator::Validate).
  out->budget_tokens = in.budget_tokens();
  return absl::OkStatus();
}

// The length of a request that names none: the room its prompt leaves in the limit of the path it
// runs on, capped by the operator's keys where set. At least 1: a prompt that leaves no room
// gets the engine's refusal naming the limit it hit (the context, or the KV capacity key).
int32_t DefaultLength(GenerationRequest& g, int32_t default_max_tokens,
                      const TotalTokenLimits& limits) {
  int64_t cap = std::numeric_limits<int32_t>::max();
  if (default_max_tokens > 0) cap = std::min<int64_t>(cap, default_max_tokens);
  if (limits.max_output_tokens > 0) cap = std::min(cap, limits.max_output_tokens);
  const int64_t prompt = static_cast<int64_t>(g.prompt.size());
  auto fit = [&](int64_t limit) {
    return static_cast<int32_t>(std::clamp<int64_t>(limit - prompt, 1, cap));
  };
  g.stopping.max_tokens = fit(limits.dense);
  if (limits.sparse > 0 && g.sparse.mode != SparseMode::kDense) {
    // Sparse requests keep their KV in the host store, not the device cache: try the length
    // that fits there, and keep it if that length is one the engine runs sparse.
    const int32_t dense_tokens = g.stopping.max_tokens;
    g.stopping.max_tokens = fit(limits.sparse);
    if (!limits.uses_sparse(g)) g.stopping.max_tokens = dense_tokens;
  }
  return g.stopping.max_tokens;
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> EncodePrompt(const Tokenizer& tokenizer,
                                                  absl::string_view text, absl::string_view field,
                                                  EncodeOptions options,
                                                  const TotalTokenLimits& limits) {
  // No request holds more tokens than the longer of its two paths.
  const int64_t most = std::max(limits.dense, limits.sparse);
  auto too_long = [&](absl::string_view how) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s more than %d tokens, the most a request can hold here (the "
                        "model's context, the KV cache capacity)",
                        field, how, most));
  };
  if (const std::optional<int64_t> bound = tokenizer.max_bytes_per_token();
      bound.has_value() && most > 0 && static_cast<int64_t>(text.size()) > most * *bound) {
    // Certain without tokenizing: no token of this tokenizer stands for more than `bound` bytes.
    return too_long(absl::StrFormat("its %d bytes encode to", text.size()));
  }
  options.max_tokens = most > 0 ? most : std::numeric_limits<int64_t>::max();
  absl::StatusOr<std::vector<int32_t>> ids =
      tokenizer.Encode(std::string_view(text.data(), text.size()), options);
  if (ids.status().code() == absl::StatusCode::kOutOfRange) return too_long("it encodes to");
  if (!ids.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", ids.status().message()));
  }
  return ids;
}

std::string NewRequestId() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("req-%016x", rng());
}

absl::Status ValidateSessionId(absl::string_view id) {
  if (id.empty() || id.size() > kMaxSessionIdBytes) {
    return absl::InvalidArgumentError(absl::StrFormat("session_id is %d bytes; it must be 1 to %d",
                                                      id.size(), kMaxSessionIdBytes));
  }
  for (size_t i = 0; i < id.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(id[i]);
    if (c <= 0x20 || c >= 0x7f) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "session_id: byte %d (0x%02x) is not printable ASCII without spaces", i, c));
    }
  }
  return absl::OkStatus();
}

namespace {

// The prompt: its text tokenized (within the limits), or its ids checked against the vocabulary.
absl::Status ConvertPrompt(const v1::GenerateRequest& request, const Tokenizer& tokenizer,
                           const TotalTokenLimits& limits, const ChatPromptFacts& chat,
                           std::vector<int32_t>* prompt) {
  const bool has_text = request.has_prompt();
  const bool has_ids = request.has_prompt_token_ids();
  if (has_text && has_ids) {
    return absl::InvalidArgumentError("set exactly one of prompt and prompt_token_ids, not both");
  }
  if (!has_text && !has_ids) {
    return absl::InvalidArgumentError("no input: set prompt, prompt_token_ids or messages");
  }
  if (has_text) {
    if (request.prompt().empty()) return absl::InvalidArgumentError("prompt is empty");
    EncodeOptions options = EncodeOptionsOf(request);
    options.plain_ranges = chat.plain_ranges;
    absl::StatusOr<std::vector<int32_t>> ids =
        EncodePrompt(tokenizer, request.prompt(), "prompt", std::move(options), limits);
    if (!ids.ok()) return ids.status();
    if (ids->empty()) return absl::InvalidArgumentError("prompt tokenizes to no tokens");
    *prompt = *std::move(ids);
  } else {
    if (request.prompt_token_ids().ids().empty()) {
      return absl::InvalidArgumentError("prompt_token_ids is empty");
    }
    RETURN_IF_ERROR(ConvertIds(request.prompt_token_ids().ids(), "prompt_token_ids", prompt));
  }
  if (limits.max_prompt_tokens > 0 &&
      static_cast<int64_t>(prompt->size()) > limits.max_prompt_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the prompt is %d tokens; this server accepts at most %d (server.limits.max_prompt_tokens)",
        prompt->size(), limits.max_prompt_tokens));
  }
  return absl::OkStatus();
}

// max_tokens (within server.limits.max_tokens, else the default length), stop strings and ids.
absl::Status ConvertStopping(const v1::StoppingCriteria& stop, int32_t default_max_tokens,
                             const TotalTokenLimits& limits, GenerationRequest* g) {
  if (stop.has_max_tokens()) {
    if (limits.max_output_tokens > 0 && stop.max_tokens() > limits.max_output_tokens) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "stopping.max_tokens = %d; this server allows at most %d (server.limits.max_tokens)",
          stop.max_tokens(), limits.max_output_tokens));
    }
    g->stopping.max_tokens = stop.max_tokens();
  } else {
    g->stopping.max_tokens = DefaultLength(*g, default_max_tokens, limits);
  }
  g->stopping.stop.assign(stop.stop().begin(), stop.stop().end());
  RETURN_IF_ERROR(
      ConvertIds(stop.stop_token_ids(), "stopping.stop_token_ids", &g->stopping.stop_token_ids));
  g->stopping.ignore_eos = stop.ignore_eos();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<EngineRequest> ToEngineRequest(const v1::GenerateRequest& request,
                                              const Tokenizer& tokenizer,
                                              int32_t default_max_tokens,
                                              const TotalTokenLimits& limits,
                                              const ChatPromptFacts& chat) {
  EngineRequest out;
  if (request.request_id().size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "request_id is %d bytes; at most %d", request.request_id().size(), kMaxRequestIdBytes));
  }
  out.request_id = request.request_id().empty() ? NewRequestId() : request.request_id();
  GenerationRequest& g = out.generation;
  if (!request.session_id().empty()) {
    RETURN_IF_ERROR(ValidateSessionId(request.session_id()));
    g.session_id = request.session_id();
  }
  RETURN_IF_ERROR(ConvertPrompt(request, tokenizer, limits, chat, &g.prompt));
  RETURN_IF_ERROR(ConvertSampling(request.sampling(), &g.sampling));
  RETURN_IF_ERROR(ConvertSparse(request.sparse(), &g.sparse));
  // After the prompt: the default length is what the context leaves.
  RETURN_IF_ERROR(ConvertStopping(request.stopping(), default_max_tokens, limits, &g));
  // Compiled here, on the calling thread, never on the engine's; once per distinct schema.
  absl::StatusOr<std::shared_ptr<const grammar::Grammar>> constraint =
      SharedCompiledConstraints().Get(request.output_constraint(), chat.answer_lead);
  if (!constraint.ok()) return constraint.status();
  g.constraint.grammar = *std::move(constraint);
  return out;
}

v1::FinishReason ToProtoFinishReason(FinishReason finish) {
  switch (finish) {
    case FinishReason::kStop:
      return v1::STOP;
    case FinishReason::kLength:
      return v1::LENGTH;
    case FinishReason::kStopSequence:
      return v1::STOP_SEQUENCE;
    case FinishReason::kNone:
    case FinishReason::kCancelled:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

void FillResponse(const StreamChunk& chunk, const std::string& request_id,
                  v1::GenerateResponse* response) {
  response->set_request_id(request_id);
  for (int32_t t : chunk.tokens) response->add_token_ids(static_cast<uint32_t>(t));
  response->set_text(chunk.text);
  for (const SampledToken& s : chunk.logprobs) {
    v1::TokenLogprobs* lp = response->add_logprobs();
    lp->set_token_id(static_cast<uint32_t>(s.token));
    lp->set_logprob(s.logprob);
    for (const TokenLogprob& alt : s.top) {
      v1::TokenLogprob* a = lp->add_top();
      a->set_token_id(static_cast<uint32_t>(alt.token));
      a->set_logprob(alt.logprob);
    }
  }
  if (chunk.done) {
    response->set_finish_reason(ToProtoFinishReason(chunk.finish));
    response->mutable_usage()->set_prompt_tokens(static_cast<uint32_t>(chunk.prompt_tokens));
    response->mutable_usage()->set_completion_tokens(
        static_cast<uint32_t>(chunk.completion_tokens));
    response->mutable_usage()->set_cached_prompt_tokens(
        static_cast<uint32_t>(chunk.cached_prompt_tokens));
    if (chunk.kv_stats.has_value()) {
      const KvStats& k = *chunk.kv_stats;
      v1::KvStats* out = response->mutable_kv_stats();
      out->set_sparse(k.sparse);
      out->set_budget_tokens(static_cast<uint64_t>(k.budget_tokens));
      out->set_pages_hit(static_cast<uint64_t>(k.pages_hit));
      out->set_pages_missed(static_cast<uint64_t>(k.pages_missed));
      out->set_pages_late(static_cast<uint64_t>(k.pages_late));
      out->set_pages_corrected(static_cast<uint64_t>(k.pages_corrected));
      out->set_bytes_prefetched(static_cast<uint64_t>(k.bytes_prefetched));
      out->set_bytes_fetched(static_cast<uint64_t>(k.bytes_fetched));
      out->set_stall_seconds(k.stall_seconds);
      out->set_hit_rate(k.hit_rate());
    }
  }
}

}  // namespace specula
