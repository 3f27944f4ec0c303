#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_impl.h"
#include "engine/tokenizer/utf8.h"

namespace specula {

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {
  // Other Tokenizer implementations (test fakes) have no position-dependent decoder rules.
  if (const auto* hf = dynamic_cast<const tokenizer_internal::HfTokenizer*>(&tokenizer)) {
    strip_left_ = hf->strip_leading();
    strip_char_ = hf->strip_char();
  }
}

std::string StreamingDetokenizer::Push(TokenId id) {
  if (skip_special_tokens_ && tokenizer_.IsSpecial(id)) return "";
  std::string bytes = tokenizer_.TokenBytes(id);
  size_t skip = 0;
  // Decode strips from the start of the whole text, which may span several (empty) tokens.
  while (strip_left_ > 0 && skip < bytes.size()) {
    if (bytes[skip] != strip_char_) {
      strip_left_ = 0;
      break;
    }
    ++skip;
    --strip_left_;
  }
  pending_.append(bytes, skip);
  std::string out;
  const size_t used = tokenizer_internal::AppendUtf8Lossy(pending_, /*final=*/false, &out);
  pending_.erase(0, used);
  return out;
}

std::string StreamingDetokenizer::Finish() {
  std::string out;
  tokenizer_internal::AppendUtf8Lossy(pending_, /*final=*/true, &out);
  pending_.clear();
  return out;
}

}  // namespace specula
