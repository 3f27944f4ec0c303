// The bytes of HTTP/1.1 responses, as specula's listeners write them: a status line, the headers
// every answer carries (Date, Content-Type, Content-Length or chunked Transfer-Encoding,
// Connection: close when the connection ends after it), the route's own headers, and chunks.
// Every response on the wire is built here, refusals included, so none is ever written twice or
// inside another's body. Independent of the network code, so it is tested on its own.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/time/time.h"
#include "server/http_server.h"

namespace specula {

// How the body after the head is delimited.
enum class BodyFraming {
  kLength,   // Content-Length: the body follows whole
  kChunked,  // Transfer-Encoding: chunked (a stream to an HTTP/1.1 client)
  kClose,    // neither: the body ends when the connection closes (a stream to HTTP/1.0)
};

struct ResponseHeadOptions {
  BodyFraming framing = BodyFraming::kLength;
  size_t content_length = 0;  // kLength only; sent on HEAD answers too (without the body)
  bool close = false;  // adds "Connection: close" (as does the response's own Connection: close)
  absl::Time now = absl::Now();
};

// The status line and headers of `response`, ending with the blank line. A route's header whose
// name is not a token or whose value holds a control character (CR or LF would split the
// response) is left out, as are the ones this function writes itself.
std::string ResponseHead(const HttpResponse& response, const ResponseHeadOptions& options);

// Whether `response` asks for the connection to close after it ("Connection: close").
bool AsksToClose(const HttpResponse& response);
// `response`, asking for the connection to close after it.
HttpResponse Closing(HttpResponse response);

// One chunk of a chunked body ("1a\r\n...\r\n"); empty data gives nothing (an empty chunk would
// end the body).
std::string Chunk(std::string_view data);
// The last chunk, with no trailers.
inline constexpr std::string_view kLastChunk = "0\r\n\r\n";

// RFC 9110 5.6.7's IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT".
std::string HttpDate(absl::Time t);

}  // namespace specula
