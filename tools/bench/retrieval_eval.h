// The retrieval model fixture's eval sets (tests/fixtures/retrieval_model/eval_<ctx>.json):
// read by `specula-bench sparse` and by the engine tests that compare KV dtypes on it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace specula {

struct RetrievalExample {
  std::vector<int32_t> prompt;  // prompt_ids
  std::vector<int32_t> answer;  // answer_ids: the greedy continuation that is right
};

// NOT_FOUND when the file cannot be read; INVALID_ARGUMENT naming the file for bad JSON.
absl::StatusOr<std::vector<RetrievalExample>> LoadRetrievalEval(const std::string& path);

}  // namespace specula
