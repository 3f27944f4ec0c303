#include "engine/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"

namespace specula::tokenizer_internal {
namespace {

std::string PcreError(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

// Per-thread match state: match data grows on demand and the JIT stack is large enough for
// patterns like `\s+(?!\S)` on long whitespace runs.
struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  MatchState() {
    data = pcre2_match_data_create(16, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (context != nullptr && jit_stack != nullptr) {
      pcre2_jit_stack_assign(context, nullptr, jit_stack);
    }
  }
  ~MatchState() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
  }
};

MatchState& ThreadMatchState() {
  thread_local MatchState state;
  return state;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern, bool literal) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // PCRE2_LITERAL rejects PCRE2_UCP; it is meaningless for a literal anyway.
  const uint32_t options = PCRE2_UTF | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error, &offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot compile regex \"", std::string(pattern),
                                                   "\" at offset ", offset, ": ",
                                                   PcreError(error)));
  }
  // Without JIT support pcre2_match falls back to the interpreter; same results, slower.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<Regex>(new Regex(code));
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

absl::Status Regex::FindAll(std::string_view text,
                            std::vector<std::pair<size_t, size_t>>* out) const {
  out->clear();
  auto* code = static_cast<pcre2_code*>(code_);
  MatchState& state = ThreadMatchState();
  if (state.data == nullptr || state.context == nullptr) {
    return absl::ResourceExhaustedError("cannot allocate PCRE2 match data");
  }
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, state.data,
                               state.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return absl::InternalError(absl::StrCat("regex match failed: ", PcreError(rc)));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state.data);
    const size_t b = ov[0], e = ov[1];
    if (e == b) {
      // Empty match: contributes nothing; step over one character so the scan progresses.
      if (b >= text.size()) break;
      size_t next = b + 1;
      while (next < text.size() && (static_cast<unsigned char>(text[next]) & 0xC0) == 0x80) ++next;
      start = next;
      continue;
    }
    out->emplace_back(b, e);
    start = e;
  }
  return absl::OkStatus();
}

}  // namespace specula::tokenizer_internal
