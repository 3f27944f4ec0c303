#include "tools/bench/serve_report.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace specula {
namespace {

constexpr int kRule = 66;

void Line(std::ostream& out, const std::string& key, const std::string& value) {
  out << absl::StrFormat("%-42s%s\n", key, value);
}

void Title(std::ostream& out, const std::string& title) {
  const int pad = std::max(0, kRule - static_cast<int>(title.size()) - 2);
  out << std::string(pad / 2, '-') << ' ' << title << ' ' << std::string(pad - pad / 2, '-')
      << "\n";
}

void LatencyRow(std::ostream& out, const std::string& name, const Distribution& d) {
  out << absl::StrFormat("%-10s%12.2f%12.2f%12.2f%12.2f%10d\n", name, d.mean * 1e3, d.p50 * 1e3,
                         d.p90 * 1e3, d.p99 * 1e3, d.count);
}

nlohmann::json ToJson(const Distribution& d) {
  return {{"count", d.count},
          {"mean_ms", d.mean * 1e3},
          {"p50_ms", d.p50 * 1e3},
          {"p90_ms", d.p90 * 1e3},
          {"p99_ms", d.p99 * 1e3}};
}

}  // namespace

void PrintReport(const ServeRunInfo& info, const LoadResult& load, const BenchSummary& s,
                 const std::optional<EngineBaseline>& engine, std::ostream& out) {
  out << std::string(kRule, '=') << "\n";
  Title(out, "specula-bench serve");
  Line(out, "Server:", absl::StrCat(info.server, " (", info.model, ")"));
  Line(out, "Arrivals:", info.arrival);
  if (info.session_suffix_len > 0) {
    Line(out, "Sessions x input / output tokens:",
         absl::StrFormat("%d x (%d of a first turn + %d new) / %d (seed %d, warmup %d)",
                         info.num_prompts, info.input_len, info.session_suffix_len, info.output_len,
                         info.seed, info.warmup));
  } else {
    Line(out, "Prompts x input / output tokens:",
         absl::StrFormat("%d x %d / %d (seed %d, warmup %d)", info.num_prompts, info.input_len,
                         info.output_len, info.seed, info.warmup));
  }
  Line(out, "Successful requests:", absl::StrCat(s.completed));
  std::string failed = absl::StrCat(s.failed);
  for (const auto& [code, n] : s.failures_by_code) absl::StrAppend(&failed, " ", code, "=", n);
  Line(out, "Failed requests:", failed);
  Line(out, "Benchmark duration (s):", absl::StrFormat("%.2f", s.duration_seconds));
  Line(out, "Total input tokens:",
       absl::StrCat(s.input_tokens, " (", s.cached_input_tokens,
                    " reused from the server's cache)"));
  Line(out, "Total generated tokens:", absl::StrCat(s.output_tokens));
  Line(out, "Request throughput (req/s):", absl::StrFormat("%.2f", s.request_throughput));
  Line(out, "Output token throughput (tok/s):", absl::StrFormat("%.1f", s.output_throughput));
  Line(out, "Total token throughput (tok/s):", absl::StrFormat("%.1f", s.total_throughput));
  Line(out, "Messages per token:",
       absl::StrFormat("%.3f (%d token messages)", s.messages_per_token, s.messages));
  // The client shares the machine with a local server: what it burns, the server cannot use.
  Line(out, "Client CPU (cores busy):",
       absl::StrFormat("%.2f (%.1f s)",
                       s.duration_seconds > 0 ? load.client_cpu_seconds / s.duration_seconds : 0,
                       load.client_cpu_seconds));
  if (!info.server_cpu_by_thread.empty()) {
    double total = 0;
    std::string by_name;
    for (const auto& [name, t] : info.server_cpu_by_thread) {
      total += t;
      absl::StrAppend(&by_name, by_name.empty() ? "" : ", ", name, " ", absl::StrFormat("%.2f", t));
    }
    Line(out, "Server CPU (cores busy):",
         absl::StrFormat("%.2f (%.1f s)", s.duration_seconds > 0 ? total / s.duration_seconds : 0,
                         total));
    Line(out, "Server CPU s by thread name:", by_name);
  }
  Title(out, "Latency (ms)");
  out << absl::StrFormat("%-10s%12s%12s%12s%12s%10s\n", "", "mean", "p50", "p90", "p99", "n");
  LatencyRow(out, "TTFT", s.ttft);
  LatencyRow(out, "TPOT", s.tpot);
  LatencyRow(out, "ITL", s.itl);
  LatencyRow(out, "E2E", s.e2e);
  if (engine.has_value()) {
    Title(out, "Server overhead (--compare-engine)");
    Line(out, "Engine in-process output tok/s:",
         absl::StrFormat("%.1f (max_running %d, mean decode batch %.1f, %.2f s)",
                         engine->output_throughput, info.engine_max_running,
                         engine->mean_decode_rows, engine->duration_seconds));
    Line(out, "Engine CPU (cores busy):",
         absl::StrFormat(
             "%.2f (%.1f s)",
             engine->duration_seconds > 0 ? engine->cpu_seconds / engine->duration_seconds : 0,
             engine->cpu_seconds));
    Line(out, "Served over gRPC output tok/s:", absl::StrFormat("%.1f", s.output_throughput));
    const double ratio =
        engine->output_throughput > 0 ? s.output_throughput / engine->output_throughput : 0;
    Line(out, "Served / engine:", absl::StrFormat("%.3f (target >= 0.90)", ratio));
    if (s.failed > 0) {
      out << "NOT COMPARABLE: " << s.failed
          << " served requests failed, the engine ran them all.\n";
    }
    out << "Valid only if the server was otherwise idle and serves the same model and settings\n"
           "(batch, KV, threads); the engine runs after the served run, on the same machine.\n";
  }
  out << std::string(kRule, '=') << "\n";
}

absl::Status WriteJson(const std::string& path, const ServeRunInfo& info, const LoadResult& load,
                       const BenchSummary& s, const std::optional<EngineBaseline>& engine) {
  nlohmann::json j;
  j["settings"] = {{"server", info.server},
                   {"model", info.model},
                   {"arrival", info.arrival},
                   {"num_prompts", info.num_prompts},
                   {"input_len", info.input_len},
                   {"output_len", info.output_len},
                   {"seed", info.seed},
                   {"warmup", info.warmup},
                   {"session_suffix_len", info.session_suffix_len}};
  j["server_cpu_s_by_thread"] = info.server_cpu_by_thread;
  nlohmann::json failures = nlohmann::json::object();
  for (const auto& [code, n] : s.failures_by_code) failures[code] = n;
  j["summary"] = {{"completed", s.completed},
                  {"failed", s.failed},
                  {"failures_by_code", failures},
                  {"duration_s", s.duration_seconds},
                  {"input_tokens", s.input_tokens},
                  {"cached_input_tokens", s.cached_input_tokens},
                  {"output_tokens", s.output_tokens},
                  {"request_throughput", s.request_throughput},
                  {"output_throughput", s.output_throughput},
                  {"total_throughput", s.total_throughput},
                  {"messages", s.messages},
                  {"messages_per_token", s.messages_per_token},
                  {"client_cpu_s", load.client_cpu_seconds},
                  {"ttft", ToJson(s.ttft)},
                  {"tpot", ToJson(s.tpot)},
                  {"itl", ToJson(s.itl)},
                  {"e2e", ToJson(s.e2e)}};
  if (engine.has_value()) {
    j["engine"] = {
        {"max_running", info.engine_max_running},
        {"load_s", engine->load_seconds},
        {"duration_s", engine->duration_seconds},
        {"cpu_s", engine->cpu_seconds},
        {"output_tokens", engine->output_tokens},
        {"steps", engine->steps},
        {"mean_decode_rows", engine->mean_decode_rows},
        {"output_throughput", engine->output_throughput},
        {"served_over_engine",
         engine->output_throughput > 0 ? s.output_throughput / engine->output_throughput : 0}};
  }
  nlohmann::json requests = nlohmann::json::array();
  for (const RequestRecord& r : load.records) {
    nlohmann::json m = nlohmann::json::array();
    for (const StreamMessage& msg : r.messages) m.push_back({msg.seconds * 1e3, msg.tokens});
    requests.push_back({{"prompt_tokens", r.prompt_tokens},
                        {"cached_prompt_tokens", r.cached_prompt_tokens},
                        {"start_ms", r.start_seconds * 1e3},
                        {"e2e_ms", r.e2e_seconds * 1e3},
                        {"ok", r.ok},
                        {"status_code", r.status_code},
                        {"error", r.error},
                        {"output_tokens", r.output_tokens()},
                        {"ttft_ms", r.ttft_seconds() * 1e3},
                        {"messages_ms_tokens", m}});
  }
  j["requests"] = std::move(requests);
  std::ofstream f(path);
  if (!f) return absl::PermissionDeniedError(absl::StrCat("--json: cannot write ", path));
  f << j.dump(1) << "\n";
  if (!f) return absl::DataLossError(absl::StrCat("--json: write failed: ", path));
  return absl::OkStatus();
}

}  // namespace specula
