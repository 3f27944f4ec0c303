// libFuzzer: the request-head framing check (server/http_framing.h). The input is read as a head:
// the first line's first byte picks the version, every further line is "name:value". Besides not
// crashing, the verdict must follow the rules whatever the bytes: a head with both Content-Length
// and Transfer-Encoding, or two Content-Lengths, is never accepted.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "server/http_framing.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string version = !text.empty() && (text[0] & 1) ? "HTTP/1.0" : "HTTP/1.1";
  std::vector<std::pair<std::string, std::string>> headers;
  int lengths = 0, codings = 0;
  size_t start = text.find('\n');
  while (start != std::string_view::npos && start < text.size()) {
    const size_t end = text.find('\n', start + 1);
    const std::string_view line = text.substr(
        start + 1, end == std::string_view::npos ? std::string_view::npos : end - start - 1);
    const size_t colon = line.find(':');
    std::string name(line.substr(0, colon));
    std::string value(colon == std::string_view::npos ? "" : line.substr(colon + 1));
    lengths += absl::EqualsIgnoreCase(name, "content-length");
    codings += absl::EqualsIgnoreCase(name, "transfer-encoding");
    headers.emplace_back(std::move(name), std::move(value));
    start = end;
  }
  const auto refusal = specula::CheckRequestHead(version, headers);
  if (refusal && refusal->status != 400 && refusal->status != 501) std::abort();
  if (!refusal && ((lengths > 0 && codings > 0) || lengths > 1)) std::abort();
  return 0;
}
