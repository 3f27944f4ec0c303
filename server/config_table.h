// The configuration schema: one row per key (its path, type, default, range or allowed names and a
// line of documentation). The YAML reader, the value checks, the flag overrides and --help are
// all driven by this table, and a test holds deploy/config/specula.yaml to it, so a key is
// declared once, here. Rules that relate several keys live in config.cc (CrossKeyViolation).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/config.h"

namespace specula {

// A key whose value is one of a few names (an enum): `parse` turns the text into the field (its
// error message is the key's), `name` gives the field's current name.
struct NamedField {
  std::function<absl::Status(absl::string_view)> parse;
  std::function<std::string()> name;
};

// Where a key's value lives in a ServerConfig. Optional ints are keys without a default (old
// names and restatements of other keys): unset unless written.
using ConfigField = std::variant<std::string*, bool*, int*, int64_t*, double*, std::optional<int>*,
                                 std::optional<int64_t>*, NamedField>;

// Value rules of one key, checked after reading and again after flag overrides.
struct NoRule {};
struct IntRange {  // [min, max]
  int64_t min;
  int64_t max;
};
struct PowerOfTwoRange {  // a power of two in [min, max]
  int64_t min;
  int64_t max;
};
struct RealRange {  // [min, max], or (min, max] when min_open; max = inf: any finite value
  double min;
  double max;
  bool min_open = false;
};
struct AddressRule {  // HOST:PORT (ParseHostPort); "" too when may_be_empty
  bool may_be_empty;
};
struct OneOf {  // a string among `names`
  std::vector<std::string> names;
};
struct TextRule {  // a string `check` accepts (a parser that lives elsewhere)
  absl::Status (*check)(absl::string_view text);
};
using ConfigRule =
    std::variant<NoRule, IntRange, PowerOfTwoRange, RealRange, AddressRule, OneOf, TextRule>;

struct ConfigKey {
  std::string path;  // "scheduler.max_running_requests"
  ConfigField (*field)(ServerConfig&);
  ConfigRule rule;
  // For --help when the rule does not say it: the names a NamedField or TextRule accepts, or
  // where the value is checked.
  std::string allowed;
  std::string doc;  // one line for --help; deploy/config/specula.yaml has the full text
};

// Every key, in the order of deploy/config/specula.yaml.
const std::vector<ConfigKey>& ConfigKeys();

// The row for `path`, or nullptr.
const ConfigKey* FindConfigKey(absl::string_view path);

// The field's value as YAML would write it unquoted ("127.0.0.1:50051", "64", "0.1", "true",
// "auto"); "" for an unset optional.
std::string FormatConfigValue(const ConfigField& field);

// Whether the key has a default (optional ints have none).
bool HasDefault(const ConfigKey& key);

// The key's rule applied to its value in `config`: nullopt, or what is wrong ("must be >= 1, got
// 0"), without the key.
std::optional<std::string> RuleViolation(const ConfigKey& key, ServerConfig& config);

// What the rule and allowed names say, for --help ("[1, 4096]", "cpu | cuda | auto").
std::string DescribeRule(const ConfigKey& key);

// The table as --help shows it: one entry per key with its type, default, rule and doc line.
std::string ConfigKeysHelp();

}  // namespace specula
