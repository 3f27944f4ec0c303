// The server's Prometheus metrics: an EngineObserver that turns engine events into latency
// histograms, token counters and load gauges, plus the HTTP exposer serving /metrics.
//
// Threading: the EngineObserver methods run on the engine thread; RecordRejected runs on gRPC
// threads; scrapes run on the HTTP server's polling thread. prometheus-cpp metrics are thread-safe,
// so no lock is needed beyond the one guarding the exposer's start.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "engine/serve/engine_observer.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/http_server.h"
#include "server/process_metrics.h"

namespace specula {

class ServerMetrics : public EngineObserver {
 public:
  // specula_prefetch_hit_ratio is over this many of the most recent steps that selected pages.
  static constexpr int kHitRatioWindowSteps = 256;

  // `model`: the served model id, the `model` label of the request metrics.
  explicit ServerMetrics(const std::string& model);
  ~ServerMetrics() override;
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  void OnAdmitted(const Admission& admission) override;
  void OnFirstToken(double ttft_seconds) override;
  void OnNextToken(double tbt_seconds) override;
  void OnStep(const StepSummary& step) override;
  void OnSparseStep(const SparseStepStats& sparse) override;
  void OnFinished(const RequestSummary& summary) override;
  void OnLoad(const EngineLoad& load) override;

  // A request the server refused before it reached the engine (validation, full queue, ...):
  // counted in specula_requests_total{finish_reason="none", code=<code>}.
  void RecordRejected(absl::StatusCode code);
  // A gRPC connection the server closed at once: `reason` is descriptor_reserve (the process is
  // near its descriptor limit) or accept_failed (accept4 failed; the listener retries).
  void RecordGrpcConnectionRefused(const std::string& reason);
  // An HTTP connection refused or closed, or a request refused, on `listener` ("openai",
  // "metrics"), by reason (HttpServerOptions::on_refused).
  void RecordHttpRefused(std::string_view listener, std::string_view reason);
  // An HTTP request answered on `listener`: its route template (never the raw path, which would
  // make unbounded series) and status (HttpServerOptions::on_answered).
  void RecordHttpRequest(std::string_view listener, std::string_view route, int status);
  // Tool calls a model began in its answer that did not parse (returned as content instead).
  void RecordToolCallParseFailures(int count);
  // The server took its fatal path (Server::ReportFatal): counted by cause.
  void RecordFatal(const std::string& cause);

  // Serves the registry at http://<host_port>/metrics ("HOST:PORT"; port 0 picks a free one) to
  // GET and HEAD; other paths get 404, other methods 405. INVALID_ARGUMENT for a malformed
  // address, UNAVAILABLE naming it when it cannot be bound, FAILED_PRECONDITION when already
  // started. `options` (idle timeout, connection limit) apply to the exposer started next.
  absl::Status StartExposer(const std::string& host_port);
  void set_exposer_options(const HttpServerOptions& options) { exposer_options_ = options; }
  // The registry in the Prometheus text format, as /metrics serves it.
  std::string Exposition() const;
  // The port the exposer listens on; 0 before StartExposer succeeded.
  int metrics_port() const;

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* tbt_;
  prometheus::Histogram* e2e_;
  prometheus::Histogram* queue_time_;
  prometheus::Histogram* batch_size_;
  prometheus::Histogram* step_duration_;
  prometheus::Histogram* step_device_wait_;
  // specula_step_seconds_total, specula_steps_total and specula_step_decoded_tokens_total by
  // kind (a prefill step decodes nothing: no decoded-tokens series).
  enum StepKind { kDecodeStep, kPrefillStep, kMixedStep, kStepKinds };
  static constexpr std::array<const char*, kStepKinds> kStepKindNames = {"decode", "prefill",
                                                                         "mixed"};
  std::array<prometheus::Counter*, kStepKinds> step_seconds_ = {};
  std::array<prometheus::Counter*, kStepKinds> steps_ = {};
  std::array<prometheus::Counter*, kStepKinds> step_decoded_ = {};
  ProcessMetrics process_;  // process_* families, read at each scrape
  prometheus::Histogram* prompt_length_;
  prometheus::Histogram* output_length_;
  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
  prometheus::Gauge* kv_blocks_used_;
  prometheus::Gauge* kv_blocks_total_;
  prometheus::Gauge* kv_usage_ratio_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* prefix_hit_tokens_;
  prometheus::Gauge* kv_blocks_cached_;
  prometheus::Gauge* kv_host_pages_cached_;
  prometheus::Gauge* sessions_;
  prometheus::Gauge* session_kv_bytes_;
  std::array<prometheus::Counter*, kEvictionReasons> evicted_pages_ = {};
  std::array<int64_t, kEvictionReasons> evicted_seen_ = {};  // load.evicted_pages last reported
  prometheus::Counter* preemptions_;
  int64_t preemptions_seen_ = 0;
  prometheus::Counter* generation_tokens_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Counter>* grpc_refused_;
  prometheus::Family<prometheus::Counter>* http_refused_;
  prometheus::Family<prometheus::Counter>* http_requests_;
  prometheus::Counter* tool_call_parse_failures_;
  prometheus::Family<prometheus::Counter>* fatal_;

  // Sparse KV cache.
  prometheus::Counter* prefetch_hits_;
  prometheus::Counter* prefetch_misses_;
  prometheus::Counter* prefetch_late_;
  prometheus::Counter* prefetch_corrections_;
  prometheus::Gauge* prefetch_hit_ratio_;
  prometheus::Counter* prefetch_bytes_;
  prometheus::Histogram* prefetch_latency_;
  prometheus::Counter* decode_stall_;
  prometheus::Counter* decode_fetch_bytes_;
  prometheus::Gauge* kv_host_pages_used_;
  prometheus::Gauge* kv_host_pages_capacity_;
  prometheus::Gauge* kv_device_slots_used_;
  // specula_prefetch_hit_ratio's window: (hits, misses + late) of the last kHitRatioWindowSteps
  // steps that selected pages, and their sums. Engine thread only.
  std::deque<std::pair<int64_t, int64_t>> hit_window_;
  int64_t window_hits_ = 0;
  int64_t window_not_hits_ = 0;

  mutable std::mutex exposer_mu_;
  HttpServerOptions exposer_options_;
  std::unique_ptr<HttpServer> exposer_;
  int port_ = 0;
};

}  // namespace specula
