// The top-level config.json keys specula knows: those the configuration parser reads (each
// honoured, or refused with an error naming it) and those known to change nothing at inference.
// docs/ENGINE_CORE.md lists both; a test keeps the two in step.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace specula {

const std::set<std::string>& ReadConfigKeys();
const std::set<std::string>& InertConfigKeys();

// The keys of `root` in neither set, sorted.
std::vector<std::string> UnrecognizedConfigKeys(const nlohmann::json& root);

}  // namespace specula
