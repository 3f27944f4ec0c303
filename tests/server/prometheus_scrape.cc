#include "tests/server/prometheus_scrape.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace specula::testing {

int ConnectLoopback(int port, int timeout_seconds) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  // Bounds every send and recv, so a server that stops answering fails the test, not hangs it.
  timeval tv{};
  tv.tv_sec = timeout_seconds;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string HttpExchange(int port, const std::string& request, int timeout_seconds) {
  const int fd = ConnectLoopback(port, timeout_seconds);
  if (fd < 0) return "";
  std::string response;
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
      static_cast<ssize_t>(request.size())) {
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, n);
  }
  ::close(fd);
  return response;
}

std::string HttpGet(int port, const std::string& path) {
  // HTTP/1.0 without Accept-Encoding: no chunking, no gzip, the server closes when done.
  return HttpExchange(port, absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: test\r\n\r\n"));
}

std::string HttpRequestText(absl::string_view method, absl::string_view path,
                            absl::string_view body) {
  return absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: t\r\nConnection: close\r\n",
                      body.empty() ? "" : absl::StrCat("Content-Length: ", body.size(), "\r\n"),
                      "\r\n", body);
}

int HttpStatus(const std::string& response) {
  // "HTTP/1.x NNN reason"
  if (response.size() < 12 || response.compare(0, 5, "HTTP/") != 0) return 0;
  return std::atoi(response.substr(9, 3).c_str());
}

namespace {

const std::regex& LabelPattern() {
  static const std::regex kLabel(R"(([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)\")");
  return kLabel;
}

// A sample key's name and its `label="value"` pairs as written.
std::pair<std::string, std::set<std::string>> SplitSampleKey(const std::string& key) {
  const size_t brace = key.find('{');
  if (brace == std::string::npos) return {key, {}};
  std::set<std::string> labels;
  const std::string inside = key.substr(brace);
  for (std::sregex_iterator it(inside.begin(), inside.end(), LabelPattern()), end; it != end;
       ++it) {
    labels.insert(it->str());
  }
  return {key.substr(0, brace), labels};
}

}  // namespace

double Exposition::Get(const std::string& key) const {
  if (auto it = samples.find(key); it != samples.end()) return it->second;
  const auto [name, wanted] = SplitSampleKey(key);
  double value = std::nan("");
  int matches = 0;
  for (const auto& [sample_key, sample_value] : samples) {
    if (sample_key.compare(0, name.size(), name) != 0) continue;
    const auto [sample_name, labels] = SplitSampleKey(sample_key);
    if (sample_name != name) continue;
    if (std::includes(labels.begin(), labels.end(), wanted.begin(), wanted.end())) {
      value = sample_value;
      ++matches;
    }
  }
  return matches == 1 ? value : std::nan("");
}

namespace {

bool ParseValue(const std::string& s, double* out) {
  if (s == "+Inf")
    *out = INFINITY;
  else if (s == "-Inf")
    *out = -INFINITY;
  else if (s == "NaN")
    *out = NAN;
  else {
    char* end = nullptr;
    *out = std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size()) return false;
  }
  return true;
}

// The family a sample belongs to, given the declared types.
std::string FamilyOf(const std::string& name, const std::map<std::string, std::string>& types) {
  if (types.count(name)) return name;
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    const std::string s = suffix;
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
      const std::string base = name.substr(0, name.size() - s.size());
      auto it = types.find(base);
      if (it != types.end() && (it->second == "histogram" || it->second == "summary")) return base;
    }
  }
  return "";
}

}  // namespace

Exposition ParseExposition(const std::string& text) {
  Exposition e;
  static const std::regex kName("[a-zA-Z_:][a-zA-Z0-9_:]*");
  static const std::regex kHelp(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) (.*))");
  static const std::regex kType(
      R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped))");
  static const std::regex kSample(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*",?)*)\})? (\S+)( -?\d+)?)");
  if (text.empty() || text.back() != '\n') e.errors.push_back("missing final newline");
  std::set<std::string> families_with_samples;
  for (absl::string_view sv : absl::StrSplit(text, '\n')) {
    const std::string line(sv);
    if (line.empty()) continue;
    std::smatch m;
    if (line[0] == '#') {
      if (std::regex_match(line, m, kHelp)) {
        if (!e.helps.insert(m[1]).second) e.errors.push_back("second HELP: " + line);
        if (m[2].str().empty()) e.errors.push_back("empty HELP: " + line);
      } else if (std::regex_match(line, m, kType)) {
        if (families_with_samples.count(m[1])) e.errors.push_back("TYPE after samples: " + line);
        if (!e.types.emplace(m[1], m[2]).second) e.errors.push_back("second TYPE: " + line);
      } else if (line.rfind("# HELP", 0) == 0 || line.rfind("# TYPE", 0) == 0) {
        e.errors.push_back("malformed comment: " + line);
      }
      continue;
    }
    if (!std::regex_match(line, m, kSample)) {
      e.errors.push_back("malformed sample: " + line);
      continue;
    }
    const std::string name = m[1];
    const std::string family = FamilyOf(name, e.types);
    if (family.empty()) e.errors.push_back("sample without TYPE: " + line);
    families_with_samples.insert(family);
    double value = 0;
    if (!ParseValue(m[4], &value)) e.errors.push_back("bad value: " + line);
    std::string labels = m[3];
    if (!labels.empty() && labels.back() == ',') labels.pop_back();
    const std::string key = labels.empty() ? name : absl::StrCat(name, "{", labels, "}");
    if (!e.samples.emplace(key, value).second) e.errors.push_back("duplicate series: " + line);
  }
  // Histograms: cumulative buckets ending in le="+Inf" equal to _count.
  for (const auto& [family, type] : e.types) {
    if (type != "histogram") continue;
    double prev = 0;
    bool saw_inf = false;
    // Our histograms carry no labels besides le, so all buckets form one series; the map
    // orders le as strings, so sort numerically.
    std::vector<std::pair<double, double>> buckets;
    for (const auto& [key, value] : e.samples) {
      std::smatch m;
      if (key.rfind(family + "_bucket{", 0) != 0) continue;
      if (!std::regex_search(key, m, std::regex(R"(le="([^"]+)\")"))) {
        e.errors.push_back("bucket without le: " + key);
        continue;
      }
      double le = 0;
      if (!ParseValue(m[1], &le)) e.errors.push_back("bad le: " + key);
      if (std::isinf(le)) saw_inf = true;
      buckets.emplace_back(le, value);
    }
    std::sort(buckets.begin(), buckets.end());
    for (const auto& [le, count] : buckets) {
      if (count < prev) e.errors.push_back(absl::StrCat(family, " buckets not cumulative"));
      prev = count;
    }
    if (!saw_inf) e.errors.push_back(family + " has no +Inf bucket");
    if (!buckets.empty() && buckets.back().second != e.Get(family + "_count")) {
      e.errors.push_back(family + " +Inf bucket != _count");
    }
    if (std::isnan(e.Get(family + "_sum"))) e.errors.push_back(family + " has no _sum");
  }
  return e;
}

PromtoolResult PromtoolCheckMetrics(const std::string& exposition) {
  char path[] = "/tmp/specula-exposition-XXXXXX";
  const int fd = mkstemp(path);
  PromtoolResult result;
  if (fd < 0) return result;
  const bool written =
      ::write(fd, exposition.data(), exposition.size()) == static_cast<ssize_t>(exposition.size());
  ::close(fd);
  if (written) {
    FILE* p = popen(absl::StrCat("promtool check metrics < ", path, " 2>&1").c_str(), "r");
    if (p != nullptr) {
      char buf[4096];
      size_t n;
      while ((n = fread(buf, 1, sizeof(buf), p)) > 0) result.output.append(buf, n);
      const int status = pclose(p);
      result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
  }
  std::remove(path);
  return result;
}

std::string HttpBody(const std::string& response) {
  const size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

Exposition ScrapeMetrics(int port) {
  const std::string response = HttpGet(port, "/metrics");
  Exposition e;
  if (HttpStatus(response) != 200 || response.find("\r\n\r\n") == std::string::npos) {
    e.errors.push_back("bad HTTP response: " + response.substr(0, 200));
    return e;
  }
  return ParseExposition(HttpBody(response));
}

}  // namespace specula::testing
