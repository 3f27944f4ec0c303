// Command lines are documented with dashes (--metrics-listen, --max-tokens), Abseil flags are
// declared with underscores; every binary accepts both, and --help lists them with dashes.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"

namespace specula {

// absl::ParseCommandLine after rewriting "--a-b[=v]" to "--a_b[=v]" (names only, never values,
// nothing after a bare "--"). `storage` keeps the rewritten strings alive for the returned args.
// --help (or -h) prints DashedFlagsHelp() and exits 0; --version prints VersionLine (the
// project version, git revision, build type and CUDA version) and exits 0.
std::vector<char*> ParseDashedCommandLine(int argc, char** argv,
                                          std::vector<std::string>* storage);

// The program's usage message, then every flag of the program (not Abseil's own) with dashes,
// its help and its default.
std::string DashedFlagsHelp();

// The value of an optional string flag that overrides a config key: nullopt when not given, the
// empty string when given empty (which Abseil alone would report as not given).
std::optional<std::string> StringOverride(const absl::Flag<std::optional<std::string>>& flag);

}  // namespace specula
