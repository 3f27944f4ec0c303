// The flags of specula-cli, shared by the offline and the server commands so that one command
// line means the same request either way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/kv/sparse_options.h"

ABSL_DECLARE_FLAG(bool, offline);
ABSL_DECLARE_FLAG(std::string, server);
ABSL_DECLARE_FLAG(double, timeout);
ABSL_DECLARE_FLAG(bool, tls);
ABSL_DECLARE_FLAG(std::string, ca_file);
ABSL_DECLARE_FLAG(std::string, cert_file);
ABSL_DECLARE_FLAG(std::string, key_file);
ABSL_DECLARE_FLAG(std::string, token_file);
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, prompt);
ABSL_DECLARE_FLAG(std::string, session_id);
ABSL_DECLARE_FLAG(std::string, prompt_ids);
ABSL_DECLARE_FLAG(bool, add_special_tokens);
ABSL_DECLARE_FLAG(bool, skip_special_tokens);
ABSL_DECLARE_FLAG(std::string, request_id);
ABSL_DECLARE_FLAG(int32_t, max_tokens);
ABSL_DECLARE_FLAG(float, temperature);
ABSL_DECLARE_FLAG(float, top_p);
ABSL_DECLARE_FLAG(int32_t, top_k);
ABSL_DECLARE_FLAG(float, min_p);
ABSL_DECLARE_FLAG(float, repetition_penalty);
ABSL_DECLARE_FLAG(float, frequency_penalty);
ABSL_DECLARE_FLAG(float, presence_penalty);
ABSL_DECLARE_FLAG(int64_t, seed);
ABSL_DECLARE_FLAG(int32_t, logprobs);
ABSL_DECLARE_FLAG(std::vector<std::string>, stop);
ABSL_DECLARE_FLAG(std::vector<std::string>, stop_token_ids);
ABSL_DECLARE_FLAG(bool, ignore_eos);
ABSL_DECLARE_FLAG(std::string, sparse_mode);
ABSL_DECLARE_FLAG(int64_t, budget_tokens);
ABSL_DECLARE_FLAG(std::string, service);
ABSL_DECLARE_FLAG(int32_t, threads);
ABSL_DECLARE_FLAG(int64_t, kv_cache_tokens);
ABSL_DECLARE_FLAG(int32_t, page_size);

namespace specula {

// Parses "1,2,3" (spaces allowed). INVALID_ARGUMENT naming `flag` on a bad or negative id.
absl::StatusOr<std::vector<int32_t>> ParseTokenIds(absl::string_view flag, absl::string_view text);
absl::StatusOr<std::vector<int32_t>> ParseTokenIds(absl::string_view flag,
                                                   const std::vector<std::string>& parts);

// --sparse-mode and --budget-tokens as the request's sparse options. INVALID_ARGUMENT naming the
// flag for an unknown mode or a negative budget (whether the server accepts the pair is its call).
absl::StatusOr<SparseRequestOptions> SparseFlags();

// The stderr line describing what the KV cache did for the request, e.g.
// "kv_stats sparse=true budget_tokens=2048 pages_hit=97 pages_missed=23 hit_rate=0.808 ...".
std::string FormatKvStats(const KvStats& stats);

}  // namespace specula
