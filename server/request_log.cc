#include "server/request_log.h"

#include "engine/common/log.h"
#include "server/status.h"

namespace specula {

void RequestLog::OnAdmitted(const Admission& a) {
  if (!LogEnabled(LogLevel::kDebug)) return;
  LogAsync(LogLevel::kDebug, "request_admitted",
      {{"request_id", a.request_id},
       {"prompt_tokens", a.prompt_tokens},
       {"cached_prompt_tokens", a.cached_prompt_tokens},
       {"queue_ms", a.queue_seconds * 1e3}});
}

void RequestLog::OnFinished(const RequestSummary& s) {
  const double decode_seconds = s.ttft_seconds >= 0 ? s.e2e_seconds - s.ttft_seconds : 0;
  const double decode_tps =
      s.completion_tokens > 1 && decode_seconds > 0 ? (s.completion_tokens - 1) / decode_seconds
                                                    : 0;
  const LogLevel level = s.code == absl::StatusCode::kOk ||
                                 s.code == absl::StatusCode::kCancelled ||
                                 s.code == absl::StatusCode::kDeadlineExceeded
                             ? LogLevel::kInfo
                             : LogLevel::kWarning;
  const double ttft_ms = s.ttft_seconds >= 0 ? s.ttft_seconds * 1e3 : -1.0;
  // Async: this runs on the engine thread, which must not wait on a slow or blocked stderr.
  // Sparse requests add what the sparse KV cache did; dense lines stay as short as before.
  std::vector<LogField> fields = {{"request_id", s.request_id},
                                  {"status", StatusCodeName(s.code)},
                                  {"finish_reason", FinishReasonName(s.finish)},
                                  {"prompt_tokens", s.prompt_tokens},
                                  {"completion_tokens", s.completion_tokens},
                                  {"queue_ms", s.queue_seconds * 1e3},
                                  {"ttft_ms", ttft_ms},
                                  {"e2e_ms", s.e2e_seconds * 1e3},
                                  {"decode_tokens_per_s", decode_tps}};
  // Every failure says why, in the server's words, whatever the client was told.
  if (s.code != absl::StatusCode::kOk) fields.push_back({"error", s.error});
  if (s.kv_stats.has_value() && s.kv_stats->sparse) {
    const KvStats& k = *s.kv_stats;
    const LogField sparse_fields[] = {{"sparse", true},
                                      {"budget_tokens", k.budget_tokens},
                                      {"pages_hit", k.pages_hit},
                                      {"pages_missed", k.pages_missed},
                                      {"pages_late", k.pages_late},
                                      {"pages_corrected", k.pages_corrected},
                                      {"hit_rate", k.hit_rate()},
                                      {"bytes_prefetched", k.bytes_prefetched},
                                      {"bytes_fetched", k.bytes_fetched},
                                      {"stall_ms", k.stall_seconds * 1e3}};
    // One at a time: GCC 12 mis-sizes a ten-element insert (-Wstringop-overflow).
    for (const LogField& f : sparse_fields) fields.push_back(f);
  }
  LogAsync(level, "request_finished", fields);
}

}  // namespace specula
