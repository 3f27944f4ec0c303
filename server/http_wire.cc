#include "server/http_wire.h"

#include <boost/beast/http/status.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/http_framing.h"

namespace specula {
namespace {

// The headers ResponseHead writes itself; a route's copy would contradict them.
bool IsFramingHeader(absl::string_view name) {
  for (absl::string_view own :
       {"date", "content-type", "content-length", "transfer-encoding", "connection"}) {
    if (absl::EqualsIgnoreCase(name, own)) return true;
  }
  return false;
}

absl::string_view ReasonPhrase(int status) {
  const auto reason =
      boost::beast::http::obsolete_reason(static_cast<boost::beast::http::status>(status));
  return absl::string_view(reason.data(), reason.size());
}

}  // namespace

bool AsksToClose(const HttpResponse& response) {
  for (const auto& [name, value] : response.headers) {
    if (absl::EqualsIgnoreCase(name, "connection") &&
        absl::StrContains(absl::AsciiStrToLower(value), "close")) {
      return true;
    }
  }
  return false;
}

HttpResponse Closing(HttpResponse response) {
  response.headers.emplace_back("Connection", "close");
  return response;
}

std::string ResponseHead(const HttpResponse& response, const ResponseHeadOptions& options) {
  std::string head = absl::StrCat("HTTP/1.1 ", response.status, " ", ReasonPhrase(response.status),
                                  "\r\nDate: ", HttpDate(options.now), "\r\n");
  if (IsFieldValue(response.content_type)) {
    absl::StrAppend(&head, "Content-Type: ", response.content_type, "\r\n");
  }
  switch (options.framing) {
    case BodyFraming::kLength:
      absl::StrAppend(&head, "Content-Length: ", options.content_length, "\r\n");
      break;
    case BodyFraming::kChunked:
      absl::StrAppend(&head, "Transfer-Encoding: chunked\r\n");
      break;
    case BodyFraming::kClose:
      break;
  }
  if (options.close || options.framing == BodyFraming::kClose || AsksToClose(response)) {
    absl::StrAppend(&head, "Connection: close\r\n");
  }
  for (const auto& [name, value] : response.headers) {
    if (IsFramingHeader(name) || !IsFieldName(name) || !IsFieldValue(value)) continue;
    absl::StrAppend(&head, name, ": ", value, "\r\n");
  }
  head += "\r\n";
  return head;
}

std::string Chunk(std::string_view data) {
  if (data.empty()) return "";
  return absl::StrCat(absl::Hex(data.size()), "\r\n", absl::string_view(data.data(), data.size()),
                      "\r\n");
}

std::string HttpDate(absl::Time t) {
  return absl::FormatTime("%a, %d %b %Y %H:%M:%S GMT", t, absl::UTCTimeZone());
}

}  // namespace specula
