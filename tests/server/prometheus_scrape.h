// Test helpers: GET /metrics over a plain socket and a strict reader of the Prometheus text
// exposition format (version 0.0.4), enough to catch anything a scraper would reject or misread.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

namespace specula::testing {

// GETs http://127.0.0.1:<port><path> with a plain socket; returns the whole response.
std::string HttpGet(int port, const std::string& path);

struct Exposition {
  std::map<std::string, std::string> types;  // family name -> counter|gauge|histogram|...
  std::set<std::string> helps;
  // "name{a=\"x\",b=\"y\"}" (labels in exposition order) -> value
  std::map<std::string, double> samples;
  std::vector<std::string> errors;

  // NaN when absent.
  double Get(const std::string& key) const;
};

Exposition ParseExposition(const std::string& text);

// Scrapes http://127.0.0.1:<port>/metrics and parses the body; HTTP problems land in `errors`.
Exposition ScrapeMetrics(int port);

}  // namespace specula::testing
