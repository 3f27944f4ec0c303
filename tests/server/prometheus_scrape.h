// Test helpers: raw HTTP exchanges and GET /metrics over a plain socket and a strict reader of the
// Prometheus text exposition format (version 0.0.4), enough to catch anything a scraper would
// reject or misread.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace specula::testing {

// A TCP connection to 127.0.0.1:<port> whose sends and receives time out after
// `timeout_seconds`; -1 when it cannot connect.
int ConnectLoopback(int port, int timeout_seconds = 10);

// Sends `request` (raw bytes) to 127.0.0.1:<port> and returns everything the server sent until
// it closed the connection, or until `timeout_seconds` passed without a byte.
std::string HttpExchange(int port, const std::string& request, int timeout_seconds = 10);

// GETs http://127.0.0.1:<port><path> with HTTP/1.0; returns the whole response.
std::string HttpGet(int port, const std::string& path);

// The status code of a raw HTTP response; 0 when it is not one.
int HttpStatus(const std::string& response);

// An HTTP/1.1 request that asks the server to close afterwards, with `body` (and its
// Content-Length) when not empty.
std::string HttpRequestText(absl::string_view method, absl::string_view path,
                            absl::string_view body = "");

struct Exposition {
  std::map<std::string, std::string> types;  // family name -> counter|gauge|histogram|...
  std::set<std::string> helps;
  // "name{a=\"x\",b=\"y\"}" (labels in exposition order) -> value
  std::map<std::string, double> samples;
  std::vector<std::string> errors;

  // The value of the one sample `key` ("name" or "name{a=\"x\",...}") selects: the sample whose
  // name is `name` and whose labels include those given (as a PromQL selector: others, like the
  // request metrics' constant `model`, may be present). NaN when none or several match.
  double Get(const std::string& key) const;
};

Exposition ParseExposition(const std::string& text);

// What `promtool check metrics` (the Prometheus project's linter) says of an exposition: its
// exit code (0 = clean; -1 when promtool could not be run) and output.
struct PromtoolResult {
  int exit_code = -1;
  std::string output;
};
PromtoolResult PromtoolCheckMetrics(const std::string& exposition);

// The body of an HTTP response (after the blank line); empty when there is none.
std::string HttpBody(const std::string& response);

// Scrapes http://127.0.0.1:<port>/metrics and parses the body; HTTP problems land in `errors`.
Exposition ScrapeMetrics(int port);

}  // namespace specula::testing
