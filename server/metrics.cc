#include "server/metrics.h"

#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/common/build_info.h"
#include "prometheus/text_serializer.h"
#include "server/config.h"
#include "server/status.h"

namespace specula {
namespace {

// Request-level latencies (queue, TTFT): sub-millisecond on an idle tiny model up to a minute
// for a long prompt behind a full queue.
const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
      0.3,    0.5,   0.75,   1,     2.5,  5,     10,   20,    40,  60};
  return *b;
}

// Whole requests: agentic generations can run for minutes.
const prometheus::Histogram::BucketBoundaries& E2eBuckets() {
  static const auto* b = [] {
    auto* v = new prometheus::Histogram::BucketBoundaries(LatencyBuckets());
    v->insert(v->end(), {120, 300, 600});
    return v;
  }();
  return *b;
}

// Per-token and per-step times: tiny models on the CPU decode in tens of microseconds, large
// ones on a GPU in tens of milliseconds; stalls show up in the upper buckets.
const prometheus::Histogram::BucketBoundaries& TokenBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      0.00005, 0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005,
      0.0075,  0.01,   0.015,   0.02,   0.025,   0.03,  0.04,   0.05,  0.075, 0.1,
      0.15,    0.2,    0.3,     0.5,    0.75,    1,     2.5,    5,     10};
  return *b;
}

// Issue -> ready of one host -> device prefetch copy: a few KiB over PCIe take microseconds, a
// batch behind a busy copy engine milliseconds; a second means the executor is far behind.
const prometheus::Histogram::BucketBoundaries& PrefetchBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
      0.005,   0.01,     0.025,   0.05,   0.1,     0.25,   0.5,   1};
  return *b;
}

const prometheus::Histogram::BucketBoundaries& BatchBuckets() {
  static const auto* b =
      new prometheus::Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
  return *b;
}

// Label values are part of the metrics' contract (dashboards and alerts match on them), so they
// are spelled here rather than borrowed from engine names that might change.
const char* FinishLabel(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStopSequence:
      return "stop_sequence";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kNone:
      return "none";
  }
  return "none";
}

// `labels`: constant labels of the family (the request metrics' model).
prometheus::Histogram* AddHistogram(prometheus::Registry& registry, const std::string& name,
                                    const std::string& help,
                                    const prometheus::Histogram::BucketBoundaries& buckets,
                                    const prometheus::Labels& labels = {}) {
  return &prometheus::BuildHistogram().Name(name).Help(help).Labels(labels).Register(registry).Add(
      {}, buckets);
}

prometheus::Gauge* AddGauge(prometheus::Registry& registry, const std::string& name,
                            const std::string& help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({});
}

prometheus::Counter* AddCounter(prometheus::Registry& registry, const std::string& name,
                                const std::string& help, const prometheus::Labels& labels = {}) {
  return &prometheus::BuildCounter().Name(name).Help(help).Labels(labels).Register(registry).Add(
      {});
}

// Request lengths in tokens: powers of two from 16 to 256K (an agent's 128K context and past it).
const prometheus::Histogram::BucketBoundaries& LengthBuckets() {
  static const auto* const kBuckets = [] {
    auto* v = new prometheus::Histogram::BucketBoundaries();
    for (double b = 16; b <= 262144; b *= 2) v->push_back(b);
    return v;
  }();
  return *kBuckets;
}

// Prometheus rejects negative counter increments and a -1 "no value" would skew histograms.
void ObserveIfValid(prometheus::Histogram* h, double v) {
  if (v >= 0) h->Observe(v);
}

}  // namespace

ServerMetrics::ServerMetrics(const std::string& model)
    : registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::Registry& r = *registry_;
  // The request metrics say which model served them, so one dashboard and one set of rules
  // cover every deployment; engine-wide gauges (KV, batch) describe the process, not a model.
  const prometheus::Labels m = {{"model", model}};
  ttft_ = AddHistogram(r, "specula_time_to_first_token_seconds",
                       "Time from request submission to its first generated token (TTFT), "
                       "including queueing and prefill.",
                       LatencyBuckets(), m);
  tbt_ = AddHistogram(r, "specula_time_between_tokens_seconds",
                      "Time between consecutive generated tokens of one request (TBT, "
                      "inter-token latency); one sample per token after the first.",
                      TokenBuckets(), m);
  e2e_ = AddHistogram(r, "specula_e2e_request_latency_seconds",
                      "Time from request submission until it left the engine (finished, "
                      "cancelled or failed).",
                      E2eBuckets(), m);
  queue_time_ = AddHistogram(r, "specula_request_queue_time_seconds",
                             "Time a request waited in the queue before the scheduler admitted "
                             "it into the running batch.",
                             LatencyBuckets(), m);
  batch_size_ = AddHistogram(r, "specula_batch_size",
                             "Sequences decoded together in one engine step (steps that decoded "
                             "at least one sequence).",
                             BatchBuckets());
  step_duration_ = AddHistogram(r, "specula_step_duration_seconds",
                                "Wall time of one engine step (a batched forward pass: prefill "
                                "chunks plus one decode token per running sequence).",
                                TokenBuckets());
  step_device_wait_ = AddHistogram(
      r, "specula_step_device_wait_seconds",
      "Of each engine step's wall time, the part the engine thread spent blocked waiting for the "
      "device (the step's readback). Step duration less this is host work: a sum near the "
      "step duration's means the device is the bottleneck, near zero that the host is.",
      TokenBuckets());
  auto& step_seconds =
      prometheus::BuildCounter()
          .Name("specula_step_seconds_total")
          .Help(
              "Wall time of engine steps, by what they ran: decode (only decode rows), prefill "
              "(only prompt work: chunks or layer-major sparse prefill units), mixed (both). "
              "rate(specula_step_decoded_tokens_total{kind=\"decode\"}) / "
              "rate(specula_step_seconds_total{kind=\"decode\"}) is the decode phase's "
              "aggregate output rate, prefill excluded.")
          .Register(r);
  auto& steps = prometheus::BuildCounter()
                    .Name("specula_steps_total")
                    .Help(
                        "Engine steps, by kind as in specula_step_seconds_total; decoded "
                        "tokens over steps of a kind is its mean batch.")
                    .Register(r);
  auto& step_decoded = prometheus::BuildCounter()
                           .Name("specula_step_decoded_tokens_total")
                           .Help(
                               "Tokens decoded (one per decode row) by engine steps, by the "
                               "step's kind as in specula_step_seconds_total; a prompt's first "
                               "token is not a decoded one.")
                           .Register(r);
  for (int i = 0; i < kStepKinds; ++i) {
    const prometheus::Labels kind = {{"kind", kStepKindNames[i]}};
    step_seconds_[i] = &step_seconds.Add(kind);
    steps_[i] = &steps.Add(kind);
    if (i != kPrefillStep) step_decoded_[i] = &step_decoded.Add(kind);
  }
  prompt_length_ = AddHistogram(r, "specula_request_prompt_tokens",
                                "Prompt length of each request that reached the engine, in "
                                "tokens (after the chat template).",
                                LengthBuckets(), m);
  output_length_ =
      AddHistogram(r, "specula_request_output_tokens",
                   "Tokens each request that reached the engine generated.", LengthBuckets(), m);
  running_ = AddGauge(r, "specula_num_requests_running",
                      "Requests in the running batch (admitted, holding KV cache).");
  waiting_ = AddGauge(r, "specula_num_requests_waiting",
                      "Requests queued and waiting for admission into the running batch.");
  kv_blocks_used_ = AddGauge(r, "specula_kv_cache_blocks_used",
                             "KV cache blocks (pages of kv_cache.page_size tokens) in use.");
  kv_blocks_total_ = AddGauge(r, "specula_kv_cache_blocks_capacity",
                              "KV cache blocks (pages of kv_cache.page_size tokens) available "
                              "in total.");
  kv_usage_ratio_ = AddGauge(r, "specula_kv_cache_usage_ratio",
                             "Fraction of KV cache blocks in use, 0 to 1; near 1 new requests "
                             "wait for memory.");
  prompt_tokens_ = AddCounter(r, "specula_prompt_tokens_total",
                              "Prompt tokens of requests admitted into the running batch.", m);
  generation_tokens_ =
      AddCounter(r, "specula_generation_tokens_total", "Tokens generated, over all requests.", m);
  prefix_hit_tokens_ = AddCounter(
      r, "specula_prefix_cache_hit_tokens_total",
      "Prompt tokens of admitted requests whose KV came from the prefix cache (a session's "
      "earlier turns or a shared prefix) instead of being computed; divide by "
      "specula_prompt_tokens_total for the hit ratio.",
      m);
  kv_blocks_cached_ = AddGauge(r, "specula_kv_cache_blocks_cached",
                               "KV cache blocks kept by the prefix cache that no request or "
                               "session holds: reusable, and free for admission (not in "
                               "specula_kv_cache_blocks_used).");
  kv_host_pages_cached_ = AddGauge(r, "specula_kv_host_pages_cached",
                                   "Host KV store pages kept by the prefix cache that no request "
                                   "or session holds (not in specula_kv_host_pages_used).");
  sessions_ = AddGauge(r, "specula_sessions", "Sessions whose KV the server keeps.");
  session_kv_bytes_ = AddGauge(r, "specula_session_kv_bytes",
                               "Bytes of KV the sessions' last turns keep (host store and KV "
                               "cache; pages shared by sessions counted in each).");
  auto& evictions = prometheus::BuildCounter()
                        .Name("specula_kv_cache_evictions_total")
                        .Help(
                            "Cached KV pages freed, by reason: capacity (least recently used, "
                            "for a request's room), session_ttl, session_deleted, "
                            "session_dropped (an idle session dropped for room), "
                            "session_limit (for a new session past kv_cache.max_sessions). "
                            "A page is "
                            "a KV cache block, or one layer's and KV head's host page.")
                        .Register(r);
  preemptions_ = AddCounter(r, "specula_preemptions_total",
                            "Running requests preempted because decode outgrew the KV cache: "
                            "their KV is parked in the prefix cache and they resume, oldest "
                            "first, recomputing what was evicted meanwhile.");
  for (int i = 0; i < kEvictionReasons; ++i) {
    evicted_pages_[i] =
        &evictions.Add({{"reason", EvictionReasonName(static_cast<EvictionReason>(i))}});
  }
  requests_ = &prometheus::BuildCounter()
                   .Name("specula_requests_total")
                   .Help(
                       "Requests that ended, by finish_reason (stop, length, stop_sequence, "
                       "cancelled, or none when it failed or was refused) and by the gRPC "
                       "status code the client received.")
                   .Labels(m)
                   .Register(r);
  // Series for the normal outcomes exist from the start, so rate() works before the first one.
  for (const char* finish : {"stop", "length", "stop_sequence"}) {
    requests_->Add({{"finish_reason", finish}, {"code", "OK"}});
  }
  grpc_refused_ = &prometheus::BuildCounter()
                       .Name("specula_grpc_connections_refused_total")
                       .Help(
                           "gRPC connections closed as soon as accepted, by reason: "
                           "descriptor_reserve (the process is near its open-file limit), "
                           "connection_limit (server.connections.grpc_max_connections are open) "
                           "or accept_failed (accept failed; the listener pauses and retries).")
                       .Register(r);
  for (const char* reason : {"descriptor_reserve", "connection_limit", "accept_failed"}) {
    grpc_refused_->Add({{"reason", reason}});
  }
  http_refused_ =
      &prometheus::BuildCounter()
           .Name("specula_http_refused_total")
           .Help(
               "HTTP connections refused or closed, and requests refused, by listener (openai, "
               "metrics) and reason: per_ip_limit, connection_limit (full, none to make room "
               "from), read_timeout (a request, or the TLS handshake before it, took longer "
               "than server.connections.http_request_read_seconds to arrive), evicted (an idle "
               "or still-reading connection closed to let a new one in at the limit); "
               "malformed (400/501 framing), body_too_large (413), unauthenticated (401).")
           .Register(r);
  for (const char* listener : {"openai", "metrics"}) {
    for (const char* reason : {"per_ip_limit", "connection_limit", "read_timeout", "evicted",
                               "malformed", "body_too_large", "unauthenticated"}) {
      http_refused_->Add({{"listener", listener}, {"reason", reason}});
    }
  }
  http_requests_ = &prometheus::BuildCounter()
                        .Name("specula_http_requests_total")
                        .Help(
                            "HTTP requests answered, by listener (openai, metrics), route "
                            "template (\"none\": refused before routing, or no route takes it) and "
                            "status (0: the client left before an answer).")
                        .Register(r);
  tool_call_parse_failures_ =
      AddCounter(r, "specula_tool_call_parse_failures_total",
                 "Tool calls a model began in its answer (a <tool_call> block, a Llama 3.1 JSON "
                 "call) that did not parse: returned as content, so the agent saw no call. "
                 "Strict tools make them impossible.",
                 m);
  prometheus::BuildGauge()
      .Name("specula_build_info")
      .Help(
          "Always 1; the labels say what is running: version (semver), revision (git), "
          "build_type, cuda (the toolkit version, or none).")
      .Register(r)
      .Add({{"version", std::string(GetBuildInfo().version)},
            {"revision", std::string(GetBuildInfo().revision)},
            {"build_type", std::string(GetBuildInfo().build_type)},
            {"cuda", std::string(GetBuildInfo().cuda)}})
      .Set(1);
  fatal_ = &prometheus::BuildCounter()
                .Name("specula_fatal_errors_total")
                .Help(
                    "Conditions the server cannot recover from, by cause (e.g. "
                    "grpc_listener_failed): health turned NOT_SERVING, in-flight requests "
                    "ended, and the process exits with status 1 to be restarted.")
                .Register(r);

  prefetch_hits_ = AddCounter(r, "specula_prefetch_hits_total",
                              "Selected KV pages (one layer's and KV head's page) that were on "
                              "the device when sparse attention needed them, without a "
                              "synchronous copy.");
  prefetch_misses_ = AddCounter(r, "specula_prefetch_misses_total",
                                "Selected KV pages that were not on the device when sparse "
                                "attention needed them (left out for one step or read from host "
                                "memory, per sparse.miss_policy).");
  prefetch_late_ = AddCounter(r, "specula_prefetch_late_total",
                              "Selected KV pages whose prefetch copy was still in flight when "
                              "their layer selected them (waited for, or read from host memory, "
                              "per sparse.miss_policy): right predictions issued too late.");
  prefetch_corrections_ = AddCounter(r, "specula_prefetch_corrections_total",
                                     "Of the missed KV pages, those miss_policy defer read from "
                                     "host memory at once because they ranked among the best "
                                     "sparse.miss_correction of their selection.");
  prefetch_hit_ratio_ = AddGauge(
      r, "specula_prefetch_hit_ratio",
      absl::StrCat("Prefetch hit ratio hits / (hits + misses + late) over the pages of the last ",
                   kHitRatioWindowSteps,
                   " engine steps that selected pages; keeps its value while no sparse request "
                   "runs, NaN before the first. For a time window use rate() of "
                   "specula_prefetch_hits_total, _misses_total and _late_total."));
  prefetch_hit_ratio_->Set(std::nan(""));
  prefetch_bytes_ = AddCounter(r, "specula_prefetch_bytes_total",
                               "Bytes the prefetch executor copied host -> device ahead of need.");
  prefetch_latency_ = AddHistogram(r, "specula_prefetch_latency_seconds",
                                   "Time from issuing a prefetch copy until it was ready on the "
                                   "device.",
                                   PrefetchBuckets());
  decode_stall_ = AddCounter(r, "specula_decode_stall_seconds_total",
                             "Decode time the compute stream stood still waiting for prefetch "
                             "copies (the engine thread's on a CPU, the device's on a GPU, from "
                             "timing events around each wait).");
  decode_fetch_bytes_ = AddCounter(r, "specula_decode_fetch_bytes_total",
                                   "KV bytes read from host memory at use (misses under fetch, "
                                   "corrections under defer) or loaded at decode start.");
  kv_host_pages_used_ = AddGauge(r, "specula_kv_host_pages_used",
                                 "Host KV store pages (one layer's and KV head's "
                                 "kv_cache.page_size tokens) held by sparse requests and "
                                 "sessions.");
  kv_host_pages_capacity_ = AddGauge(
      r, "specula_kv_host_pages_capacity",
      "Host KV store pages in total (kv_cache.host_capacity_tokens per layer and KV head); "
      "0 without a host store.");
  kv_device_slots_used_ = AddGauge(r, "specula_kv_device_slots_used",
                                   "KV cache pages on the device held by sparse working sets "
                                   "(selected pages, sinks, recent window, prefetch slots).");
}

ServerMetrics::~ServerMetrics() = default;

void ServerMetrics::OnAdmitted(const Admission& a) {
  ObserveIfValid(queue_time_, a.queue_seconds);
  if (a.prompt_tokens > 0) prompt_tokens_->Increment(static_cast<double>(a.prompt_tokens));
  if (a.cached_prompt_tokens > 0) {
    prefix_hit_tokens_->Increment(static_cast<double>(a.cached_prompt_tokens));
  }
}

void ServerMetrics::OnFirstToken(double ttft_seconds) {
  ObserveIfValid(ttft_, ttft_seconds);
  generation_tokens_->Increment();
}

void ServerMetrics::OnNextToken(double tbt_seconds) {
  ObserveIfValid(tbt_, tbt_seconds);
  generation_tokens_->Increment();
}

void ServerMetrics::OnStep(const StepSummary& step) {
  if (step.decode_rows > 0) batch_size_->Observe(step.decode_rows);
  ObserveIfValid(step_duration_, step.seconds);
  ObserveIfValid(step_device_wait_, step.device_wait_seconds);
  if (step.decode_rows == 0 && step.prefill_rows == 0) return;  // nothing ran
  const int kind = step.prefill_rows == 0  ? kDecodeStep
                   : step.decode_rows == 0 ? kPrefillStep
                                           : kMixedStep;
  if (step.seconds >= 0) step_seconds_[kind]->Increment(step.seconds);
  steps_[kind]->Increment();
  if (kind != kPrefillStep) step_decoded_[kind]->Increment(step.decode_rows);
}

void ServerMetrics::OnSparseStep(const SparseStepStats& sparse) {
  prefetch_hits_->Increment(static_cast<double>(sparse.pages_hit));
  prefetch_misses_->Increment(static_cast<double>(sparse.pages_missed));
  prefetch_late_->Increment(static_cast<double>(sparse.pages_late));
  prefetch_corrections_->Increment(static_cast<double>(sparse.pages_corrected));
  prefetch_bytes_->Increment(static_cast<double>(sparse.bytes_prefetched));
  decode_fetch_bytes_->Increment(static_cast<double>(sparse.bytes_fetched));
  decode_stall_->Increment(sparse.stall_seconds);
  for (double seconds : sparse.prefetch_latencies_seconds) {
    ObserveIfValid(prefetch_latency_, seconds);
  }

  // Steps that only prefetched (nothing selected) would dilute the window without saying anything
  // about hits.
  const int64_t not_hit = sparse.pages_missed + sparse.pages_late;
  if (sparse.pages_hit + not_hit == 0) return;
  hit_window_.emplace_back(sparse.pages_hit, not_hit);
  window_hits_ += sparse.pages_hit;
  window_not_hits_ += not_hit;
  if (hit_window_.size() > static_cast<size_t>(kHitRatioWindowSteps)) {
    window_hits_ -= hit_window_.front().first;
    window_not_hits_ -= hit_window_.front().second;
    hit_window_.pop_front();
  }
  prefetch_hit_ratio_->Set(static_cast<double>(window_hits_) /
                           static_cast<double>(window_hits_ + window_not_hits_));
}

void ServerMetrics::OnFinished(const RequestSummary& summary) {
  ObserveIfValid(e2e_, summary.e2e_seconds);
  if (summary.prompt_tokens > 0) {
    prompt_length_->Observe(static_cast<double>(summary.prompt_tokens));
    output_length_->Observe(static_cast<double>(summary.completion_tokens));
  }
  requests_
      ->Add({{"finish_reason", FinishLabel(summary.finish)},
             {"code", std::string(StatusCodeName(summary.code))}})
      .Increment();
}

void ServerMetrics::OnLoad(const EngineLoad& load) {
  running_->Set(load.running);
  waiting_->Set(load.waiting);
  kv_blocks_used_->Set(static_cast<double>(load.kv_blocks_used));
  kv_blocks_total_->Set(static_cast<double>(load.kv_blocks_total));
  kv_usage_ratio_->Set(load.kv_blocks_total > 0 ? static_cast<double>(load.kv_blocks_used) /
                                                      static_cast<double>(load.kv_blocks_total)
                                                : 0.0);
  kv_host_pages_used_->Set(static_cast<double>(load.host_pages_used));
  kv_host_pages_capacity_->Set(static_cast<double>(load.host_pages_capacity));
  kv_device_slots_used_->Set(static_cast<double>(load.device_slots_used));
  kv_blocks_cached_->Set(static_cast<double>(load.kv_blocks_cached));
  kv_host_pages_cached_->Set(static_cast<double>(load.host_pages_cached));
  sessions_->Set(static_cast<double>(load.sessions));
  session_kv_bytes_->Set(static_cast<double>(load.session_kv_bytes));
  for (int i = 0; i < kEvictionReasons; ++i) {
    const int64_t delta = load.evicted_pages[i] - evicted_seen_[i];
    if (delta > 0) evicted_pages_[i]->Increment(static_cast<double>(delta));
    evicted_seen_[i] = load.evicted_pages[i];
  }
  if (load.preemptions > preemptions_seen_) {
    preemptions_->Increment(static_cast<double>(load.preemptions - preemptions_seen_));
    preemptions_seen_ = load.preemptions;
  }
}

void ServerMetrics::RecordRejected(absl::StatusCode code) {
  requests_->Add({{"finish_reason", "none"}, {"code", std::string(StatusCodeName(code))}})
      .Increment();
}

void ServerMetrics::RecordGrpcConnectionRefused(const std::string& reason) {
  grpc_refused_->Add({{"reason", reason}}).Increment();
}

void ServerMetrics::RecordHttpRefused(std::string_view listener, std::string_view reason) {
  http_refused_->Add({{"listener", std::string(listener)}, {"reason", std::string(reason)}})
      .Increment();
}

void ServerMetrics::RecordHttpRequest(std::string_view listener, std::string_view route,
                                      int status) {
  http_requests_
      ->Add({{"listener", std::string(listener)},
             {"route", std::string(route)},
             {"status", std::to_string(status)}})
      .Increment();
}

void ServerMetrics::RecordToolCallParseFailures(int count) {
  if (count > 0) tool_call_parse_failures_->Increment(count);
}

void ServerMetrics::RecordFatal(const std::string& cause) {
  fatal_->Add({{"cause", cause}}).Increment();
}

std::string ServerMetrics::Exposition() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (prometheus::MetricFamily& f : process_.Collect()) families.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(families);
}

absl::Status ServerMetrics::StartExposer(const std::string& host_port) {
  if (absl::Status s = ParseHostPort(host_port); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address: ", s.message()));
  }
  std::lock_guard<std::mutex> lock(exposer_mu_);
  if (exposer_ != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("metrics exposer already started on port ", port_));
  }
  HttpRoute metrics{"/metrics",
                    {"GET", "HEAD"},
                    [this](const HttpRequest&) {
                      HttpResponse r;
                      r.content_type = "text/plain; version=0.0.4; charset=utf-8";
                      r.body = Exposition();
                      return r;
                    },
                    nullptr};
  HttpServerOptions options = exposer_options_;
  if (!options.on_refused) {
    options.on_refused = [this](std::string_view reason) { RecordHttpRefused("metrics", reason); };
  }
  if (!options.on_answered) {
    options.on_answered = [this](std::string_view route, int status) {
      RecordHttpRequest("metrics", route, status);
    };
  }
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      HttpServer::Start(host_port, {std::move(metrics)}, options);
  if (!server.ok()) {
    return absl::Status(server.status().code(),
                        absl::StrCat("metrics: ", server.status().message()));
  }
  exposer_ = *std::move(server);
  port_ = exposer_->port();
  return absl::OkStatus();
}

int ServerMetrics::metrics_port() const {
  std::lock_guard<std::mutex> lock(exposer_mu_);
  return port_;
}

}  // namespace specula
