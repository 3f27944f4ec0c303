#include "tests/engine/chat/template/test_util.h"

#include <algorithm>
#include <ctime>
#include <fstream>
#include <sstream>

namespace specula::chat_template_test {
namespace {

std::string Escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

jinja::LocalTime FixedNow() {
  std::tm tm{};
  tm.tm_year = 2024 - 1900;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  tm.tm_hour = 10;
  tm.tm_min = 30;
  tm.tm_sec = 15;
  const std::time_t t = timegm(&tm);  // fills in tm_wday and tm_yday
  jinja::LocalTime now;
  gmtime_r(&t, &now.tm);
  now.tm.tm_isdst = -1;
  now.microseconds = 250000;
  return now;
}

std::vector<Snippet> LoadSnippets(const std::string& path) {
  std::istringstream in(ReadFile(path));
  nlohmann::ordered_json defaults = nlohmann::ordered_json::object();
  std::vector<Snippet> snippets;
  std::vector<std::string> body;
  bool in_body = false;
  auto finish = [&] {
    if (snippets.empty()) return;
    for (size_t i = 0; i < body.size(); ++i) {
      snippets.back().source += (i > 0 ? "\n" : "") + body[i];
    }
    body.clear();
  };
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("=== ")) {
      finish();
      snippets.push_back({line.substr(4), "", defaults});
      in_body = false;
    } else if (snippets.empty()) {
      if (line.starts_with("default-context:")) {
        defaults = nlohmann::ordered_json::parse(line.substr(16));
      }
    } else if (!in_body) {
      if (line.starts_with("context:")) {
        snippets.back().context.update(nlohmann::ordered_json::parse(line.substr(8)));
      }
      in_body = line == "---";
    } else {
      body.push_back(line);
    }
  }
  finish();
  return snippets;
}

std::string DescribeMismatch(std::string_view expected, std::string_view actual) {
  size_t at = 0;
  while (at < expected.size() && at < actual.size() && expected[at] == actual[at]) ++at;
  const size_t line = 1 + std::count(expected.begin(), expected.begin() + at, '\n');
  const size_t from = at > 60 ? at - 60 : 0;
  std::ostringstream out;
  out << "first difference at byte " << at << " (line " << line << ")"
      << "; expected size " << expected.size() << ", actual size " << actual.size() << "\n"
      << "  expected: ..." << Escape(expected.substr(from, 140)) << "\n"
      << "  actual:   ..." << Escape(actual.substr(from, 140)) << "\n"
      << "  common:   ..." << Escape(expected.substr(from, at - from)) << "<HERE>";
  return out.str();
}

}  // namespace specula::chat_template_test
