// Command lines are documented with dashes (--metrics-listen, --max-tokens), Abseil flags are
// declared with underscores; every binary accepts both.
#pragma once

#include <string>
#include <vector>

#include "absl/flags/parse.h"

namespace specula {

// absl::ParseCommandLine after rewriting "--a-b[=v]" to "--a_b[=v]" (names only, never values,
// nothing after a bare "--"). `storage` keeps the rewritten strings alive for the returned args.
std::vector<char*> ParseDashedCommandLine(int argc, char** argv,
                                          std::vector<std::string>* storage);

}  // namespace specula
