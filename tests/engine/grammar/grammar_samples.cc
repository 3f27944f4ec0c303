// Prints random sentences of the grammars compiled from a file of JSON Schemas, one JSON line
// each ({"schema": index, "text": sentence}), for json_schema_samples_test.py to validate with
// an independent validator (Python's jsonschema).
//
// usage: grammar_samples SCHEMAS_JSON SAMPLES_PER_SCHEMA
// SCHEMAS_JSON: an array of {"schema": ..., "strict": bool}.
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/grammar/json_schema.h"
#include "engine/grammar/matcher.h"

namespace specula::grammar {
namespace {

// A random walk through the grammar: a random allowed byte at each step (structural bytes
// favoured so that strings close), ending where the grammar can end with some chance. Empty when
// it ran past `max_bytes`.
std::string RandomSentence(const std::shared_ptr<const Grammar>& g, std::mt19937& rng,
                           size_t max_bytes) {
  GrammarMatcher m(g);
  std::string text;
  while (text.size() < max_bytes) {
    if (m.CanEnd() && (m.IsComplete() || rng() % 4 == 0)) return text;
    std::vector<uint8_t> allowed, structural;
    for (int b = 0; b < 256; ++b) {
      if (!m.Allows(static_cast<uint8_t>(b))) continue;
      allowed.push_back(static_cast<uint8_t>(b));
      if (std::string_view("\"}],:").find(static_cast<char>(b)) != std::string_view::npos) {
        structural.push_back(static_cast<uint8_t>(b));
      }
    }
    const std::vector<uint8_t>& pool = !structural.empty() && rng() % 3 == 0 ? structural : allowed;
    const char c = static_cast<char>(pool[rng() % pool.size()]);
    if (!m.Advance(std::string_view(&c, 1))) return "";  // cannot happen: Allows said so
    text += c;
  }
  return "";
}

int Main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: grammar_samples SCHEMAS_JSON SAMPLES_PER_SCHEMA\n";
    return 2;
  }
  std::ifstream in(argv[1]);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const auto schemas = nlohmann::ordered_json::parse(buffer.str());
  const int samples = std::stoi(argv[2]);
  std::mt19937 rng(1234);
  for (size_t i = 0; i < schemas.size(); ++i) {
    JsonSchemaOptions options;
    options.strict = schemas[i].value("strict", false);
    auto g = CompileJsonSchema(schemas[i]["schema"], options);
    if (!g.ok()) {
      std::cerr << "schema " << i << ": " << g.status() << "\n";
      return 1;
    }
    for (int s = 0; s < samples; ++s) {
      const std::string text = RandomSentence(*g, rng, 4096);
      if (!text.empty()) {
        std::cout << nlohmann::ordered_json{{"schema", i}, {"text", text}}.dump() << "\n";
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace specula::grammar

int main(int argc, char** argv) { return specula::grammar::Main(argc, argv); }
