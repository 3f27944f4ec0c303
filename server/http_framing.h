// RFC 9112's rules for where a request's body ends, checked on the request head before anything
// else reads it. A head whose framing is ambiguous (Content-Length with Transfer-Encoding, two
// Content-Lengths: the classic request-smuggling pairs) or not understood (a transfer coding other
// than chunked) leaves the server unable to tell where the next request begins, so the answer is
// an error and the connection is closed. Malformed fields (a name that is not a token, a control
// character in a value, a missing or repeated Host in HTTP/1.1) are refused the same way.
//
// Independent of the HTTP library, so it is fuzzed on its own (tests/fuzz/fuzz_http_head.cc).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace specula {

struct HeadRefusal {
  int status;          // 400, or 501 for a transfer coding the server does not implement
  std::string reason;  // for the client and the log
};

// RFC 9110 5.1: a field name is a token (tchar: letters, digits and !#$%&'*+-.^_`|~).
bool IsFieldName(std::string_view name);
// RFC 9110 5.5: field values hold visible characters, spaces, tabs and obs-text (0x80-0xFF); no
// other control character, NUL, CR or LF above all.
bool IsFieldValue(std::string_view value);

// `version` as on the request line ("HTTP/1.1"); `headers` as received: names as sent (any
// case), values with surrounding whitespace already trimmed, both possibly holding any byte.
std::optional<HeadRefusal> CheckRequestHead(
    std::string_view version, const std::vector<std::pair<std::string, std::string>>& headers);

}  // namespace specula
