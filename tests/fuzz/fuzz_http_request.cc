// libFuzzer: the HTTP listener's request framing as a connection sees it: Boost.Beast's parser
// with specula's body type (server/http_body.h) over the input as one connection's bytes (several
// requests when they are pipelined), each parsed head checked by CheckRequestHead, and each
// accepted request's headers echoed into a response head (server/http_wire.h). Besides not
// crashing, whatever the bytes:
// - a request the two accept never has both Content-Length and Transfer-Encoding, nor two
//   Content-Lengths (the smuggling pairs);
// - a body keeps at most its limit, and with a Content-Length exactly that many bytes;
// - a response head is one status line and "name: value" lines, with no CR or LF inside a line,
//   ending with the one blank line.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// clang-format off
#include <boost/beast/http/parser.hpp>
// clang-format on

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "server/http_body.h"
#include "server/http_framing.h"
#include "server/http_wire.h"

namespace {

namespace http = boost::beast::http;

constexpr size_t kLimit = 64;

void CheckResponseHead(const specula::HttpRequest& request) {
  specula::HttpResponse echo;
  echo.headers = request.headers;
  echo.content_type = request.path;  // any bytes
  specula::ResponseHeadOptions options;
  options.now = absl::UnixEpoch();
  const std::string head = specula::ResponseHead(echo, options);
  if (head.size() < 4 || head.substr(head.size() - 4) != "\r\n\r\n") std::abort();
  if (head.find("\r\n\r\n") != head.size() - 4) std::abort();
  for (size_t i = 0; i < head.size(); ++i) {
    const bool crlf = head[i] == '\r' && i + 1 < head.size() && head[i + 1] == '\n';
    if (head[i] == '\r' && !crlf) std::abort();
    if (head[i] == '\n' && (i == 0 || head[i - 1] != '\r')) std::abort();
  }
}

void CheckAccepted(const http::request<specula::CappedStringBody>& message) {
  specula::HttpRequest request;
  request.path = std::string(message.target());
  int lengths = 0, codings = 0;
  for (const auto& field : message) {
    request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    lengths += absl::EqualsIgnoreCase(request.headers.back().first, "content-length");
    codings += absl::EqualsIgnoreCase(request.headers.back().first, "transfer-encoding");
  }
  const std::string version = message.version() == 10 ? "HTTP/1.0" : "HTTP/1.1";
  if (specula::CheckRequestHead(version, request.headers).has_value()) return;
  if ((lengths > 0 && codings > 0) || lengths > 1) std::abort();
  const specula::CappedStringBody::value_type& body = message.body();
  if (body.data.size() > kLimit) std::abort();
  if (lengths == 1 && body.dropped == 0) {
    const auto field = message[http::field::content_length];
    uint64_t declared = 0;
    if (!absl::SimpleAtoi(absl::string_view(field.data(), field.size()), &declared) ||
        declared != body.data.size()) {
      std::abort();
    }
  }
  CheckResponseHead(request);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  for (int message = 0; message < 8 && !rest.empty(); ++message) {
    http::request_parser<specula::CappedStringBody> parser;
    parser.eager(true);
    parser.header_limit(4096);
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    parser.get().body().limit = kLimit;
    boost::beast::error_code ec;
    while (!parser.is_done() && !rest.empty()) {
      const size_t used = parser.put(boost::asio::buffer(rest.data(), rest.size()), ec);
      rest.remove_prefix(used);
      if (ec == http::error::need_more) {
        if (used == 0) break;
        ec = {};
        continue;
      }
      if (ec) return 0;  // refused: the connection closes
    }
    if (!parser.is_done()) {
      parser.put_eof(ec);
      if (ec || !parser.is_done()) return 0;
    }
    CheckAccepted(parser.get());
  }
  return 0;
}
