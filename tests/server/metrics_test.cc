#include "server/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "engine/common/build_info.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/prometheus_scrape.h"
#include "tests/server/sparse_metric_families.h"

namespace specula {
namespace {

using ::specula::testing::Exposition;
using ::specula::testing::ParseExposition;
using ::specula::testing::ScrapeMetrics;
using ::specula::testing::SparseMetricFamilies;
using ::testing::HasSubstr;

constexpr char kModel[] = "test-model";

Exposition Scrape(const ServerMetrics& metrics) { return ScrapeMetrics(metrics.metrics_port()); }

// Reads one unlabelled gauge straight from the registry (no HTTP round trip).
double GaugeValue(const ServerMetrics& metrics, const std::string& name) {
  for (const auto& family : metrics.registry()->Collect()) {
    if (family.name == name && family.metric.size() == 1) return family.metric[0].gauge.value;
  }
  return std::nan("");
}

void DriveTraffic(ServerMetrics& m) {
  m.OnAdmitted(Admission{"r1", 5, 0, 0.002});
  m.OnAdmitted(Admission{"r2", 7, 4, 0.5});
  m.OnFirstToken(0.01);
  m.OnFirstToken(0.03);
  m.OnNextToken(0.0003);
  m.OnNextToken(0.0004);
  m.OnNextToken(0.0005);
  m.OnStep({/*decode_rows=*/3, /*prefill_tokens=*/0, /*seconds=*/0.004,
            /*device_wait_seconds=*/0.003});
  m.OnStep({/*decode_rows=*/0, /*prefill_tokens=*/100, /*seconds=*/0.02,
            /*device_wait_seconds=*/0.0005, /*prefill_rows=*/1});
  RequestSummary done;
  done.request_id = "r1";
  done.finish = FinishReason::kStop;
  done.code = absl::StatusCode::kOk;
  done.e2e_seconds = 1.5;
  done.prompt_tokens = 100;
  done.completion_tokens = 5;
  m.OnFinished(done);
  RequestSummary cancelled = done;
  cancelled.request_id = "r2";
  cancelled.finish = FinishReason::kCancelled;
  cancelled.code = absl::StatusCode::kCancelled;
  cancelled.e2e_seconds = 0.25;
  m.OnFinished(cancelled);
  m.RecordRejected(absl::StatusCode::kResourceExhausted);
  m.RecordRejected(absl::StatusCode::kResourceExhausted);
  m.RecordRejected(absl::StatusCode::kInvalidArgument);
  m.RecordToolCallParseFailures(2);
  m.RecordToolCallParseFailures(0);
  SparseStepStats sparse;
  sparse.pages_hit = 30;
  sparse.pages_missed = 10;
  sparse.pages_late = 8;
  sparse.pages_corrected = 3;
  sparse.bytes_prefetched = 3 * 8192;
  sparse.bytes_fetched = 8192;
  sparse.stall_seconds = 0.002;
  sparse.prefetch_latencies_seconds = {0.00002, 0.0003};
  m.OnSparseStep(sparse);
  sparse.pages_hit = 6;
  sparse.pages_missed = 2;
  sparse.pages_late = 0;
  sparse.pages_corrected = 1;
  sparse.bytes_prefetched = 8192;
  sparse.bytes_fetched = 0;
  sparse.stall_seconds = 0.0005;
  sparse.prefetch_latencies_seconds = {0.2};
  m.OnSparseStep(sparse);
  m.OnLoad({/*waiting=*/3, /*running=*/2, /*kv_blocks_used=*/10, /*kv_blocks_total=*/40,
            /*kv_page_size=*/16, /*host_pages_used=*/12, /*host_pages_capacity=*/100,
            /*device_slots_used=*/5});
}

// The prefix cache's counters arrive as running totals in EngineLoad; the Prometheus counters
// must advance by the differences, never twice for the same evictions.
TEST(MetricsTest, PrefixCacheAndSessionMetricsFollowTheLoad) {
  ServerMetrics m(kModel);
  m.OnAdmitted(Admission{"r1", 100, 64, 0.001});
  m.OnAdmitted(Admission{"r2", 50, 0, 0.001});
  EngineLoad load;
  load.kv_blocks_cached = 7;
  load.host_pages_cached = 9;
  load.sessions = 2;
  load.session_kv_bytes = 4096;
  load.evicted_pages = {3, 0, 5, 1};
  load.preemptions = 2;
  m.OnLoad(load);
  m.OnLoad(load);  // published again with nothing new
  load.evicted_pages = {4, 2, 5, 1};
  load.preemptions = 3;
  load.sessions = 1;
  m.OnLoad(load);
  const Exposition e = ParseExposition(m.Exposition());
  EXPECT_THAT(e.errors, ::testing::IsEmpty());
  EXPECT_EQ(e.Get("specula_prefix_cache_hit_tokens_total"), 64);
  EXPECT_EQ(e.Get("specula_prompt_tokens_total"), 150);
  EXPECT_EQ(e.Get("specula_kv_cache_blocks_cached"), 7);
  EXPECT_EQ(e.Get("specula_kv_host_pages_cached"), 9);
  EXPECT_EQ(e.Get("specula_sessions"), 1);
  EXPECT_EQ(e.Get("specula_session_kv_bytes"), 4096);
  EXPECT_EQ(e.Get(R"(specula_kv_cache_evictions_total{reason="capacity"})"), 4);
  EXPECT_EQ(e.Get(R"(specula_kv_cache_evictions_total{reason="session_ttl"})"), 2);
  EXPECT_EQ(e.Get(R"(specula_kv_cache_evictions_total{reason="session_deleted"})"), 5);
  EXPECT_EQ(e.Get(R"(specula_kv_cache_evictions_total{reason="session_dropped"})"), 1);
  EXPECT_EQ(e.Get("specula_preemptions_total"), 3);
}

TEST(MetricsTest, ScrapeOverHttpIsValidAndCarriesEveryMetric) {
  ServerMetrics metrics(kModel);
  EXPECT_EQ(metrics.metrics_port(), 0);
  ASSERT_TRUE(metrics.StartExposer("127.0.0.1:0").ok());
  ASSERT_GT(metrics.metrics_port(), 0);
  DriveTraffic(metrics);

  const Exposition e = Scrape(metrics);
  EXPECT_THAT(e.errors, ::testing::IsEmpty());
  std::map<std::string, std::string> expected_types = {
      {"specula_time_to_first_token_seconds", "histogram"},
      {"specula_time_between_tokens_seconds", "histogram"},
      {"specula_e2e_request_latency_seconds", "histogram"},
      {"specula_request_queue_time_seconds", "histogram"},
      {"specula_batch_size", "histogram"},
      {"specula_step_duration_seconds", "histogram"},
      {"specula_step_device_wait_seconds", "histogram"},
      {"specula_num_requests_running", "gauge"},
      {"specula_num_requests_waiting", "gauge"},
      {"specula_kv_cache_blocks_used", "gauge"},
      {"specula_kv_cache_blocks_capacity", "gauge"},
      {"specula_kv_cache_usage_ratio", "gauge"},
      {"specula_prompt_tokens_total", "counter"},
      {"specula_generation_tokens_total", "counter"},
      {"specula_requests_total", "counter"},
      {"specula_build_info", "gauge"},
      {"specula_http_refused_total", "counter"},
      {"specula_request_prompt_tokens", "histogram"},
      {"specula_request_output_tokens", "histogram"},
      {"process_cpu_seconds_total", "counter"},
      {"process_resident_memory_bytes", "gauge"},
      {"process_virtual_memory_bytes", "gauge"},
      {"process_open_fds", "gauge"},
      {"process_max_fds", "gauge"},
      {"process_start_time_seconds", "gauge"},
  };
  expected_types.insert(SparseMetricFamilies().begin(), SparseMetricFamilies().end());
  for (const auto& [name, type] : expected_types) {
    auto it = e.types.find(name);
    ASSERT_NE(it, e.types.end()) << name;
    EXPECT_EQ(it->second, type) << name;
    EXPECT_TRUE(e.helps.count(name)) << name;
  }

  // The first scrape was counted when it ended (by route template and status).
  const Exposition again = Scrape(metrics);
  EXPECT_GE(
      again.Get(
          "specula_http_requests_total{listener=\"metrics\",route=\"/metrics\",status=\"200\"}"),
      1);

  // What is running (issue 39): one sample, 1, labelled with this build.
  const BuildInfo& b = GetBuildInfo();
  EXPECT_EQ(
      e.Get(absl::StrCat("specula_build_info{build_type=\"", b.build_type, "\",cuda=\"", b.cuda,
                         "\",revision=\"", b.revision, "\",version=\"", b.version, "\"}")),
      1);
  EXPECT_EQ(e.Get("specula_request_queue_time_seconds_count"), 2);
  EXPECT_NEAR(e.Get("specula_request_queue_time_seconds_sum"), 0.502, 1e-9);
  EXPECT_EQ(e.Get("specula_time_to_first_token_seconds_count"), 2);
  EXPECT_NEAR(e.Get("specula_time_to_first_token_seconds_sum"), 0.04, 1e-9);
  EXPECT_EQ(e.Get("specula_time_between_tokens_seconds_count"), 3);
  EXPECT_NEAR(e.Get("specula_time_between_tokens_seconds_sum"), 0.0012, 1e-9);
  // Sub-millisecond TBT lands in sub-millisecond buckets.
  EXPECT_EQ(e.Get("specula_time_between_tokens_seconds_bucket{le=\"0.0005\"}"), 3);
  EXPECT_EQ(e.Get("specula_time_between_tokens_seconds_bucket{le=\"0.00025\"}"), 0);
  EXPECT_EQ(e.Get("specula_e2e_request_latency_seconds_count"), 2);
  EXPECT_NEAR(e.Get("specula_e2e_request_latency_seconds_sum"), 1.75, 1e-9);
  EXPECT_EQ(e.Get("specula_step_duration_seconds_count"), 2);
  EXPECT_NEAR(e.Get("specula_step_device_wait_seconds_sum"), 0.0035, 1e-9);
  // Only the step that decoded counts toward the batch size.
  EXPECT_EQ(e.Get("specula_batch_size_count"), 1);
  EXPECT_EQ(e.Get("specula_batch_size_sum"), 3);
  EXPECT_EQ(e.Get("specula_batch_size_bucket{le=\"2\"}"), 0);
  EXPECT_EQ(e.Get("specula_batch_size_bucket{le=\"4\"}"), 1);
  EXPECT_EQ(e.Get("specula_batch_size_bucket{le=\"512\"}"), 1);

  // Request lengths: both finished requests had 100 prompt and 5 output tokens.
  EXPECT_EQ(e.Get("specula_request_prompt_tokens_count"), 2);
  EXPECT_EQ(e.Get("specula_request_prompt_tokens_bucket{le=\"64\"}"), 0);
  EXPECT_EQ(e.Get("specula_request_prompt_tokens_bucket{le=\"128\"}"), 2);
  EXPECT_EQ(e.Get("specula_request_output_tokens_sum"), 10);
  EXPECT_EQ(e.Get("specula_request_output_tokens_bucket{le=\"16\"}"), 2);
  // The process: this test's own figures.
  EXPECT_GT(e.Get("process_resident_memory_bytes"), 1 << 20);
  EXPECT_GT(e.Get("process_open_fds"), 2);
  EXPECT_GE(e.Get("process_max_fds"), e.Get("process_open_fds"));
  const double now = absl::ToUnixSeconds(absl::Now());
  EXPECT_LE(e.Get("process_start_time_seconds"), now + 1);
  EXPECT_GT(e.Get("process_start_time_seconds"), now - 3600);

  EXPECT_EQ(e.Get("specula_tool_call_parse_failures_total"), 2);
  EXPECT_EQ(e.Get("specula_prompt_tokens_total"), 12);
  EXPECT_EQ(e.Get("specula_generation_tokens_total"), 5);
  EXPECT_EQ(e.Get("specula_num_requests_waiting"), 3);
  EXPECT_EQ(e.Get("specula_num_requests_running"), 2);
  EXPECT_EQ(e.Get("specula_kv_cache_blocks_used"), 10);
  EXPECT_EQ(e.Get("specula_kv_cache_blocks_capacity"), 40);
  EXPECT_DOUBLE_EQ(e.Get("specula_kv_cache_usage_ratio"), 0.25);

  // prometheus-cpp writes labels sorted by name.
  EXPECT_EQ(e.Get("specula_requests_total{code=\"OK\",finish_reason=\"stop\"}"), 1);
  EXPECT_EQ(e.Get("specula_requests_total{code=\"CANCELLED\",finish_reason=\"cancelled\"}"), 1);
  EXPECT_EQ(e.Get("specula_requests_total{code=\"RESOURCE_EXHAUSTED\",finish_reason=\"none\"}"), 2);
  EXPECT_EQ(e.Get("specula_requests_total{code=\"INVALID_ARGUMENT\",finish_reason=\"none\"}"), 1);
  // Normal outcomes exist before they first happen.
  EXPECT_EQ(e.Get("specula_requests_total{code=\"OK\",finish_reason=\"length\"}"), 0);
  EXPECT_EQ(e.Get("specula_requests_total{code=\"OK\",finish_reason=\"stop_sequence\"}"), 0);

  EXPECT_EQ(e.Get("specula_prefetch_hits_total"), 36);
  EXPECT_EQ(e.Get("specula_prefetch_misses_total"), 12);
  EXPECT_EQ(e.Get("specula_prefetch_late_total"), 8);
  EXPECT_EQ(e.Get("specula_prefetch_corrections_total"), 4);
  // Late pages are not hits: 36 / (36 + 12 + 8).
  EXPECT_DOUBLE_EQ(e.Get("specula_prefetch_hit_ratio"), 36.0 / 56.0);
  EXPECT_EQ(e.Get("specula_prefetch_bytes_total"), 4 * 8192);
  EXPECT_EQ(e.Get("specula_decode_fetch_bytes_total"), 8192);
  EXPECT_NEAR(e.Get("specula_decode_stall_seconds_total"), 0.0025, 1e-12);
  EXPECT_EQ(e.Get("specula_prefetch_latency_seconds_count"), 3);
  EXPECT_NEAR(e.Get("specula_prefetch_latency_seconds_sum"), 0.20032, 1e-12);
  // Buckets start at 10 us and end at 1 s.
  EXPECT_EQ(e.Get("specula_prefetch_latency_seconds_bucket{le=\"1e-05\"}"), 0);
  EXPECT_EQ(e.Get("specula_prefetch_latency_seconds_bucket{le=\"2.5e-05\"}"), 1);
  EXPECT_EQ(e.Get("specula_prefetch_latency_seconds_bucket{le=\"0.0005\"}"), 2);
  EXPECT_EQ(e.Get("specula_prefetch_latency_seconds_bucket{le=\"0.1\"}"), 2);
  EXPECT_EQ(e.Get("specula_prefetch_latency_seconds_bucket{le=\"1\"}"), 3);
  EXPECT_EQ(e.Get("specula_kv_host_pages_used"), 12);
  EXPECT_EQ(e.Get("specula_kv_host_pages_capacity"), 100);
  EXPECT_EQ(e.Get("specula_kv_device_slots_used"), 5);
}

TEST(MetricsTest, PrefetchHitRatioIsOverTheRecentStepsThatSelectedPages) {
  ServerMetrics metrics(kModel);
  auto ratio = [&] { return GaugeValue(metrics, "specula_prefetch_hit_ratio"); };
  auto step = [&](int64_t hits, int64_t misses, int64_t late = 0) {
    SparseStepStats s;
    s.pages_hit = hits;
    s.pages_missed = misses;
    s.pages_late = late;
    metrics.OnSparseStep(s);
  };
  // No sparse step yet: no ratio to speak of (and no false "0% hits" alert).
  EXPECT_TRUE(std::isnan(ratio()));
  step(1, 3);
  EXPECT_DOUBLE_EQ(ratio(), 0.25);
  // Weighted by pages, not by steps.
  step(11, 1);
  EXPECT_DOUBLE_EQ(ratio(), 0.75);
  // A step that only prefetched says nothing about hits: the ratio stays.
  SparseStepStats prefetch_only;
  prefetch_only.bytes_prefetched = 4096;
  metrics.OnSparseStep(prefetch_only);
  EXPECT_DOUBLE_EQ(ratio(), 0.75);
  // A full window of all-miss steps pushes the earlier ones out...
  for (int i = 0; i < ServerMetrics::kHitRatioWindowSteps; ++i) step(0, 2);
  EXPECT_EQ(ratio(), 0);
  // ...and one all-hit step is then one step of the window.
  step(2, 0);
  EXPECT_DOUBLE_EQ(ratio(), 1.0 / ServerMetrics::kHitRatioWindowSteps);
  for (int i = 0; i < ServerMetrics::kHitRatioWindowSteps; ++i) step(5, 0);
  EXPECT_EQ(ratio(), 1);
  // A step whose pages were all late alone counts as not hit, and only late pages make a step
  // that selected pages.
  for (int i = 0; i < ServerMetrics::kHitRatioWindowSteps; ++i) step(0, 0, 3);
  EXPECT_EQ(ratio(), 0);
}

// Steps are split by what they ran, so the decode phase's rate leaves prefill out. A layer-major
// sparse prefill unit (prefill_rows 1, prefill_tokens 0 until its last unit) is prompt work.
TEST(MetricsTest, StepTimeAndDecodedTokensAreSplitByWhatTheStepRan) {
  ServerMetrics metrics(kModel);
  auto step = [&](int32_t decode_rows, int32_t prefill_tokens, int32_t prefill_rows,
                  double seconds) {
    metrics.OnStep({decode_rows, prefill_tokens, seconds, /*device_wait_seconds=*/0, prefill_rows});
  };
  step(4, 0, 0, 0.010);    // decode
  step(16, 0, 0, 0.030);   // decode
  step(0, 512, 1, 0.100);  // a prompt chunk alone
  step(0, 0, 1, 0.200);    // a layer-major unit alone
  step(3, 0, 1, 0.050);    // a layer-major unit beside 3 decode rows
  step(2, 256, 1, 0.070);  // a chunk beside 2 decode rows
  step(0, 0, 0, 0.500);    // ran nothing (a failed step's rows): no kind
  const Exposition e = ParseExposition(metrics.Exposition());
  EXPECT_NEAR(e.Get("specula_step_seconds_total{kind=\"decode\"}"), 0.040, 1e-12);
  EXPECT_NEAR(e.Get("specula_step_seconds_total{kind=\"prefill\"}"), 0.300, 1e-12);
  EXPECT_NEAR(e.Get("specula_step_seconds_total{kind=\"mixed\"}"), 0.120, 1e-12);
  EXPECT_EQ(e.Get("specula_step_decoded_tokens_total{kind=\"decode\"}"), 20);
  EXPECT_EQ(e.Get("specula_step_decoded_tokens_total{kind=\"mixed\"}"), 5);
  EXPECT_TRUE(std::isnan(e.Get("specula_step_decoded_tokens_total{kind=\"prefill\"}")));
  EXPECT_EQ(e.Get("specula_steps_total{kind=\"decode\"}"), 2);
  EXPECT_EQ(e.Get("specula_steps_total{kind=\"prefill\"}"), 2);
  EXPECT_EQ(e.Get("specula_steps_total{kind=\"mixed\"}"), 2);
  // Every step still counts in the duration histogram.
  EXPECT_EQ(e.Get("specula_step_duration_seconds_count"), 7);
}

// Each figure follows the process: a descriptor opened is counted, CPU time spent is counted.
TEST(ProcessMetricsTest, FollowTheProcess) {
  const ProcessStats before = ReadProcessStats().value();
  const int fd = dup(0);
  ASSERT_GE(fd, 0);
  volatile double spin = 0;
  for (int i = 0; i < 50'000'000; ++i) spin = spin + i;
  const ProcessStats after = ReadProcessStats().value();
  close(fd);
  EXPECT_EQ(after.open_fds, before.open_fds + 1);
  EXPECT_GT(after.cpu_seconds, before.cpu_seconds);
  EXPECT_EQ(after.start_time_seconds, before.start_time_seconds);
  EXPECT_GT(ProcessMetrics().Collect().size(), 5u);
}

// The README's metrics table names every family the server exports, and nothing else: a new
// metric without its row, or a row for a metric that is gone, fails here.
TEST(MetricsTest, TheReadmeTableListsExactlyTheExportedFamilies) {
  ServerMetrics metrics(kModel);
  // Labelled families appear with their first sample.
  metrics.RecordFatal("test");
  metrics.RecordHttpRequest("openai", "/v1/models", 200);
  const Exposition e = ParseExposition(metrics.Exposition());
  std::set<std::string> exported;
  for (const auto& [name, type] : e.types) exported.insert(name);
  std::ifstream readme(SPECULA_SOURCE_DIR "/README.md");
  ASSERT_TRUE(readme) << "README.md";
  std::string text((std::istreambuf_iterator<char>(readme)), std::istreambuf_iterator<char>());
  const size_t begin = text.find("## Metrics");
  ASSERT_NE(begin, std::string::npos);
  const std::string section = text.substr(begin, text.find("\nBuckets:", begin) - begin);
  std::set<std::string> documented;
  const std::regex name(R"(`((?:specula|process)_[a-z0-9_]+))");
  for (std::sregex_iterator it(section.begin(), section.end(), name), end; it != end; ++it) {
    documented.insert((*it)[1]);
  }
  EXPECT_EQ(documented, exported);
}

TEST(MetricsTest, ParserRejectsMalformedExposition) {
  EXPECT_THAT(ParseExposition("# TYPE a counter\na 1\n").errors, ::testing::IsEmpty());
  EXPECT_THAT(ParseExposition("a 1\n").errors, ::testing::Not(::testing::IsEmpty()));
  EXPECT_THAT(ParseExposition("# TYPE a counter\na one\n").errors,
              ::testing::Not(::testing::IsEmpty()));
  EXPECT_THAT(ParseExposition("# TYPE a counter\na{l=x} 1\n").errors,
              ::testing::Not(::testing::IsEmpty()));
  EXPECT_THAT(ParseExposition("# TYPE a counter\na 1").errors,
              ::testing::Not(::testing::IsEmpty()));
  EXPECT_THAT(ParseExposition("# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\n"
                              "h_count 1\nh_sum 1\n")
                  .errors,
              ::testing::Not(::testing::IsEmpty()));
}

TEST(MetricsTest, ZeroTotalKvBlocksGivesZeroRatio) {
  ServerMetrics metrics(kModel);
  metrics.OnLoad({/*waiting=*/0, /*running=*/0, /*kv_blocks_used=*/0, /*kv_blocks_total=*/0,
                  /*kv_page_size=*/16});
  EXPECT_EQ(GaugeValue(metrics, "specula_kv_cache_usage_ratio"), 0);
  metrics.OnLoad({/*waiting=*/0, /*running=*/1, /*kv_blocks_used=*/8, /*kv_blocks_total=*/8,
                  /*kv_page_size=*/16});
  EXPECT_EQ(GaugeValue(metrics, "specula_kv_cache_usage_ratio"), 1);
}

TEST(MetricsTest, RecordRejectedIsThreadSafe) {
  ServerMetrics metrics(kModel);
  ASSERT_TRUE(metrics.StartExposer("127.0.0.1:0").ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) metrics.RecordRejected(absl::StatusCode::kUnavailable);
    });
  }
  // A concurrent scrape must still see a well-formed exposition.
  const Exposition during = Scrape(metrics);
  EXPECT_THAT(during.errors, ::testing::IsEmpty());
  for (auto& th : threads) th.join();
  EXPECT_EQ(
      Scrape(metrics).Get("specula_requests_total{code=\"UNAVAILABLE\",finish_reason=\"none\"}"),
      4000);
}

TEST(MetricsTest, StartExposerErrors) {
  ServerMetrics metrics(kModel);
  absl::Status s = metrics.StartExposer("nonsense");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("'nonsense'"));

  ASSERT_TRUE(metrics.StartExposer("127.0.0.1:0").ok());
  s = metrics.StartExposer("127.0.0.1:0");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);

  // The port is taken by the first exposer.
  const std::string taken = absl::StrCat("127.0.0.1:", metrics.metrics_port());
  ServerMetrics other(kModel);
  s = other.StartExposer(taken);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr(taken));
  EXPECT_EQ(other.metrics_port(), 0);
}

// Request metrics carry the served model (dashboards and rules select and group by it); the
// engine-wide ones describe the process and carry none.
TEST(MetricsTest, RequestMetricsCarryTheModelLabel) {
  ServerMetrics metrics(kModel);
  DriveTraffic(metrics);
  const std::set<std::string> labelled = {
      "specula_time_to_first_token_seconds",   "specula_time_between_tokens_seconds",
      "specula_e2e_request_latency_seconds",   "specula_request_queue_time_seconds",
      "specula_request_prompt_tokens",         "specula_request_output_tokens",
      "specula_prompt_tokens_total",           "specula_generation_tokens_total",
      "specula_prefix_cache_hit_tokens_total", "specula_requests_total",
      "specula_tool_call_parse_failures_total"};
  std::set<std::string> seen;
  for (const auto& family : metrics.registry()->Collect()) {
    for (const auto& metric : family.metric) {
      const auto model = std::find_if(metric.label.begin(), metric.label.end(),
                                      [](const auto& l) { return l.name == "model"; });
      if (labelled.count(family.name)) {
        ASSERT_NE(model, metric.label.end()) << family.name;
        EXPECT_EQ(model->value, kModel) << family.name;
        seen.insert(family.name);
      } else {
        EXPECT_EQ(model, metric.label.end()) << family.name;
      }
    }
  }
  EXPECT_EQ(seen, labelled);
  const Exposition e = ParseExposition(metrics.Exposition());
  EXPECT_EQ(e.Get(R"(specula_requests_total{code="OK",finish_reason="stop",model="test-model"})"),
            1);
  EXPECT_EQ(e.Get(R"(specula_generation_tokens_total{model="test-model"})"), 5);
}

// Get selects as PromQL does: the labels given must be present, others may be; it answers only
// when exactly one sample matches.
TEST(MetricsTest, ExpositionGetSelectsTheOneSampleWithTheGivenLabels) {
  const Exposition e = ParseExposition(
      "# TYPE c counter\nc{a=\"x\",m=\"1\"} 3\nc{a=\"y\",m=\"1\"} 4\n# TYPE cc counter\ncc 9\n");
  ASSERT_THAT(e.errors, ::testing::IsEmpty());
  EXPECT_EQ(e.Get(R"(c{a="x"})"), 3);
  EXPECT_EQ(e.Get(R"(c{a="y",m="1"})"), 4);
  EXPECT_TRUE(std::isnan(e.Get("c")));  // two samples match
  EXPECT_TRUE(std::isnan(e.Get(R"(c{a="z"})")));
  EXPECT_TRUE(std::isnan(e.Get(R"(c{m="2"})")));
  EXPECT_EQ(e.Get("cc"), 9);
}

TEST(MetricsTest, RegistryIsScrapableWithoutExposer) {
  ServerMetrics metrics(kModel);
  metrics.OnFirstToken(0.2);
  const auto families = metrics.registry()->Collect();
  bool found = false;
  for (const auto& f : families) {
    if (f.name == "specula_time_to_first_token_seconds") {
      found = true;
      ASSERT_EQ(f.metric.size(), 1u);
      EXPECT_EQ(f.metric[0].histogram.sample_count, 1u);
    }
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace specula
