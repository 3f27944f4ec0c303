#include "server/bearer_tokens.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/common/bounded_file.h"
#include "engine/common/status_macros.h"

namespace specula {
namespace {

constexpr size_t kMinTokenBytes = 16;  // shorter ones are guessable
constexpr size_t kMaxTokenBytes = 4096;
constexpr int64_t kMaxTokenFileBytes = 1 << 20;  // room for hundreds of the longest tokens

// Compares without stopping at the first difference: the time depends on the lengths only.
bool EqualInConstantTime(absl::string_view a, absl::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0;
    const unsigned char y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

bool ValidToken(absl::string_view t) {
  if (t.size() < kMinTokenBytes || t.size() > kMaxTokenBytes) return false;
  for (char c : t) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> BearerTokens::Read(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text,
                   ReadBoundedFile(path, kMaxTokenFileBytes, "server.auth.token_file"));
  std::vector<std::string> tokens;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    const absl::string_view t = absl::StripAsciiWhitespace(line);
    if (t.empty() || t[0] == '#') continue;
    if (!ValidToken(t)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "server.auth.token_file: ", path, ":", number, ": a token must be ", kMinTokenBytes,
          " to ", kMaxTokenBytes, " printable ASCII characters without spaces"));
    }
    tokens.emplace_back(t);
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("server.auth.token_file: ", path, " holds no token"));
  }
  return tokens;
}

absl::StatusOr<std::unique_ptr<BearerTokens>> BearerTokens::Load(const std::string& path) {
  std::unique_ptr<BearerTokens> tokens(new BearerTokens(path));
  if (absl::Status s = tokens->Reload(); !s.ok()) return s;
  return tokens;
}

absl::Status BearerTokens::Reload() {
  absl::StatusOr<std::vector<std::string>> tokens = Read(path_);
  if (!tokens.ok()) return tokens.status();
  std::lock_guard lock(mu_);
  tokens_ = *std::move(tokens);
  return absl::OkStatus();
}

size_t BearerTokens::size() const {
  std::lock_guard lock(mu_);
  return tokens_.size();
}

std::optional<absl::string_view> BearerTokenOf(absl::string_view authorization) {
  constexpr absl::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(authorization.substr(0, kScheme.size()), kScheme)) {
    return std::nullopt;
  }
  const absl::string_view token = absl::StripAsciiWhitespace(authorization.substr(kScheme.size()));
  if (token.empty()) return std::nullopt;
  return token;
}

bool BearerTokens::Allows(absl::string_view authorization) const {
  const std::optional<absl::string_view> presented = BearerTokenOf(authorization);
  if (!presented.has_value()) return false;
  std::lock_guard lock(mu_);
  bool allowed = false;
  for (const std::string& token : tokens_) allowed |= EqualInConstantTime(*presented, token);
  return allowed;
}

}  // namespace specula
