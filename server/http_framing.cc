#include "server/http_framing.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace specula {
namespace {

// RFC 9110 5.6.2: tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." / "^" / "_"
// / "`" / "|" / "~" / DIGIT / ALPHA.
bool IsTokenChar(unsigned char c) {
  return absl::ascii_isalnum(c) ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

}  // namespace

bool IsFieldName(std::string_view s) {
  if (s.empty()) return false;
  for (unsigned char c : s) {
    if (!IsTokenChar(c)) return false;
  }
  return true;
}

bool IsFieldValue(std::string_view s) {
  for (unsigned char c : s) {
    if ((c < 0x20 && c != '\t') || c == 0x7f) return false;
  }
  return true;
}

namespace {

// RFC 9110 8.6: Content-Length = 1*DIGIT, and it must fit the length type.
bool IsContentLength(absl::string_view s) {
  if (s.empty() || s.size() > 19) return false;  // 19 digits always fit in 63 bits
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

HeadRefusal BadRequest(std::string reason) { return {400, std::move(reason)}; }

// Transfer-Encoding, every field's list together: only exactly "chunked" is understood.
std::optional<HeadRefusal> CheckTransferCodings(const std::vector<absl::string_view>& values) {
  std::vector<std::string> codings;
  for (absl::string_view value : values) {
    for (absl::string_view coding : absl::StrSplit(value, ',')) {
      codings.push_back(absl::AsciiStrToLower(absl::StripAsciiWhitespace(coding)));
    }
  }
  if (codings.size() == 1 && codings[0] == "chunked") return std::nullopt;
  return HeadRefusal{501, "the Transfer-Encoding is not supported: only 'chunked' is"};
}

}  // namespace

std::optional<HeadRefusal> CheckRequestHead(
    std::string_view version, const std::vector<std::pair<std::string, std::string>>& headers) {
  int hosts = 0;
  std::vector<absl::string_view> content_lengths;
  std::vector<absl::string_view> transfer_encodings;
  for (const auto& [name, value] : headers) {
    if (!IsFieldName(name)) return BadRequest("a header name is not a token (RFC 9110 5.1)");
    if (!IsFieldValue(value)) {
      return BadRequest(absl::StrCat("header '", name, "' holds a control character"));
    }
    if (absl::EqualsIgnoreCase(name, "host")) ++hosts;
    if (absl::EqualsIgnoreCase(name, "content-length")) content_lengths.push_back(value);
    if (absl::EqualsIgnoreCase(name, "transfer-encoding")) transfer_encodings.push_back(value);
  }
  const bool http11 = version == "HTTP/1.1";
  if (http11 && hosts != 1) {
    return BadRequest(hosts == 0 ? "HTTP/1.1 needs a Host header" : "more than one Host header");
  }
  if (!transfer_encodings.empty()) {
    if (!content_lengths.empty()) {
      return BadRequest(
          "Content-Length together with Transfer-Encoding: the body's end is ambiguous");
    }
    if (!http11) return BadRequest("Transfer-Encoding needs HTTP/1.1");
    return CheckTransferCodings(transfer_encodings);
  }
  if (content_lengths.size() > 1) return BadRequest("more than one Content-Length header");
  if (content_lengths.size() == 1 && !IsContentLength(content_lengths[0])) {
    return BadRequest("the Content-Length is not a decimal length");
  }
  return std::nullopt;
}

}  // namespace specula
