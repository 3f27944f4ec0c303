// The official JSON Schema Test Suite (Debian `json-schema-test-suite`, draft 7) as acceptance
// tests of the compiler and matcher: for every group whose schema compiles, an instance the suite
// calls invalid must never be accepted (the grammar writes only valid texts). Valid instances may
// be refused (the grammar writes a subset: declared properties in order, bounded numbers, ...);
// how many are accepted is reported.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "engine/grammar/json_schema.h"
#include "engine/grammar/matcher.h"
#include "gtest/gtest.h"
#include "tests/engine/grammar/accepts.h"

namespace specula::grammar {
namespace {

using ::specula::grammar::testing::Accepts;

using Json = nlohmann::ordered_json;
constexpr char kSuite[] = "/usr/share/json-schema-test-suite/tests/draft7";

TEST(JsonSchemaSuiteTest, NoInvalidInstanceIsEverAccepted) {
  ASSERT_TRUE(std::filesystem::is_directory(kSuite))
      << kSuite << " is missing: tools/install-deps.sh installs json-schema-test-suite";
  int groups = 0, compiled = 0, invalid = 0, valid = 0, valid_accepted = 0;
  for (const auto& file : std::filesystem::directory_iterator(kSuite)) {
    if (file.path().extension() != ".json") continue;
    std::ifstream in(file.path());
    std::stringstream text;
    text << in.rdbuf();
    for (const Json& group : Json::parse(text.str())) {
      ++groups;
      auto g = CompileJsonSchema(group["schema"]);
      if (!g.ok()) continue;  // a keyword not supported: refused by name, tested elsewhere
      ++compiled;
      for (const Json& test : group["tests"]) {
        const std::string instance = test["data"].dump();
        const bool accepted = Accepts(*g, instance);
        if (test["valid"].get<bool>()) {
          ++valid;
          valid_accepted += accepted;
        } else {
          ++invalid;
          EXPECT_FALSE(accepted) << file.path().filename() << ": " << group["description"] << " / "
                                 << test["description"] << ": " << instance;
        }
      }
    }
  }
  std::cout << compiled << " of " << groups << " groups compile; " << invalid
            << " invalid instances refused; " << valid_accepted << " of " << valid
            << " valid instances accepted\n";
  // 73 of 124 on 2026-11-28 (with pattern, number bounds, false subschemas, tuples, integer
  // multipleOf, discriminated oneOf, propertyNames and property counts, allOf of object
  // schemas, keywords beside a choice, patternProperties maps, not of a type): the rest use
  // keywords not supported.
  EXPECT_GE(compiled, 73);
  EXPECT_GE(invalid, 114);
}

}  // namespace
}  // namespace specula::grammar
