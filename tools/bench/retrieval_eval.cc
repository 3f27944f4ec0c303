#include "tools/bench/retrieval_eval.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace specula {

absl::StatusOr<std::vector<RetrievalExample>> LoadRetrievalEval(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  try {
    nlohmann::json j;
    in >> j;
    std::vector<RetrievalExample> out;
    for (const auto& e : j.at("examples")) {
      out.push_back({e.at("prompt_ids").get<std::vector<int32_t>>(),
                     e.at("answer_ids").get<std::vector<int32_t>>()});
    }
    return out;
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
}

}  // namespace specula
