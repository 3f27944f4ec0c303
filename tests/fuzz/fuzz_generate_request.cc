// libFuzzer: a GenerateRequest as gRPC delivers it (bytes) through parsing and the validation
// and conversion every Generate call runs (server/request_parse.h, request_convert.h), against
// a small byte-level tokenizer.
#include <cstddef>
#include <cstdint>
#include <string>

#include "google/protobuf/stubs/logging.h"
#include "grpcpp/support/byte_buffer.h"
#include "server/request_convert.h"
#include "server/request_parse.h"
#include "specula/v1/specula.pb.h"

namespace {

// Bytes 0..255 as tokens, no merges: every text encodes.
constexpr char kByteTokenizer[] = R"({
  "model": {"type": "BPE", "vocab": {}, "merges": [], "byte_fallback": false},
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
  "decoder": {"type": "ByteLevel"}, "added_tokens": []})";

// Null if the JSON above did not load (then the conversion is not fuzzed, visibly: no coverage).
const specula::Tokenizer* ByteTokenizer() {
  static const specula::Tokenizer* tokenizer = [] {
    auto t = specula::Tokenizer::FromJson(kByteTokenizer, "");
    return t.ok() ? t->release() : nullptr;
  }();
  return tokenizer;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Invalid UTF-8 in a string field is an expected refusal here, not worth a log line per input.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  grpc::Slice slice(data, size);
  grpc::ByteBuffer bytes(&slice, 1);
  specula::v1::GenerateRequest request;
  if (!specula::ParseRequest(bytes, &request).ok()) return 0;
  specula::TotalTokenLimits limits;
  limits.dense = 4096;
  limits.sparse = 65536;
  limits.uses_sparse = [](const specula::GenerationRequest& g) {
    return g.sparse.mode == specula::SparseMode::kSparse;
  };
  if (const specula::Tokenizer* tokenizer = ByteTokenizer()) {
    (void)specula::ToEngineRequest(request, *tokenizer, 256, limits);
  }
  return 0;
}
