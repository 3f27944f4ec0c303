#include "tools/bench/serve_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/status/status.h"

namespace specula {

double Percentile(const std::vector<double>& sorted, double p) {
  const double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

double Median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

Distribution Summarize(std::vector<double> values) {
  Distribution d;
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  d.count = values.size();
  d.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(d.count);
  d.p50 = Percentile(values, 50);
  d.p90 = Percentile(values, 90);
  d.p99 = Percentile(values, 99);
  return d;
}

int64_t RequestRecord::output_tokens() const {
  int64_t n = 0;
  for (const StreamMessage& m : messages) n += m.tokens;
  return n;
}

double RequestRecord::ttft_seconds() const {
  for (const StreamMessage& m : messages) {
    if (m.tokens > 0) return m.seconds;
  }
  return 0;
}

void AppendInterTokenLatencies(const std::vector<StreamMessage>& messages,
                               std::vector<double>* out) {
  bool seen_first = false;
  double last = 0;
  for (const StreamMessage& m : messages) {
    if (m.tokens <= 0) continue;
    if (seen_first) {
      const double share = (m.seconds - last) / m.tokens;
      out->insert(out->end(), m.tokens, share);
    }
    seen_first = true;
    last = m.seconds;
  }
}

BenchSummary SummarizeRun(const std::vector<RequestRecord>& records, double duration_seconds) {
  BenchSummary s;
  s.duration_seconds = duration_seconds;
  std::vector<double> ttft, tpot, itl, e2e;
  for (const RequestRecord& r : records) {
    if (!r.ok) {
      ++s.failed;
      ++s.failures_by_code[absl::StatusCodeToString(static_cast<absl::StatusCode>(r.status_code))];
      continue;
    }
    ++s.completed;
    const int64_t n = r.output_tokens();
    s.input_tokens += r.prompt_tokens;
    s.cached_input_tokens += r.cached_prompt_tokens;
    s.output_tokens += n;
    for (const StreamMessage& m : r.messages) s.messages += m.tokens > 0 ? 1 : 0;
    e2e.push_back(r.e2e_seconds);
    if (n == 0) continue;
    ttft.push_back(r.ttft_seconds());
    if (n >= 2) tpot.push_back((r.e2e_seconds - r.ttft_seconds()) / static_cast<double>(n - 1));
    AppendInterTokenLatencies(r.messages, &itl);
  }
  if (duration_seconds > 0) {
    s.request_throughput = static_cast<double>(s.completed) / duration_seconds;
    s.output_throughput = static_cast<double>(s.output_tokens) / duration_seconds;
    s.total_throughput = static_cast<double>(s.input_tokens + s.output_tokens) / duration_seconds;
  }
  if (s.output_tokens > 0) {
    s.messages_per_token = static_cast<double>(s.messages) / static_cast<double>(s.output_tokens);
  }
  s.ttft = Summarize(std::move(ttft));
  s.tpot = Summarize(std::move(tpot));
  s.itl = Summarize(std::move(itl));
  s.e2e = Summarize(std::move(e2e));
  return s;
}

PoissonArrivals::PoissonArrivals(double rate_per_second, uint64_t seed)
    : rate_(rate_per_second), rng_(seed) {}

double PoissonArrivals::NextGapSeconds() {
  if (std::isinf(rate_)) return 0;
  // u in (0, 1]: 53 random bits, shifted off zero so the log stays finite.
  const double u = (static_cast<double>(rng_() >> 11) + 1.0) * 0x1.0p-53;
  return -std::log(u) / rate_;
}

std::vector<double> ArrivalOffsets(int n, double rate_per_second, uint64_t seed) {
  PoissonArrivals arrivals(rate_per_second, seed);
  std::vector<double> out;
  out.reserve(n);
  double t = 0;
  for (int i = 0; i < n; ++i) {
    // The first request goes at once, as in vllm; the gaps separate the following ones.
    if (i > 0) t += arrivals.NextGapSeconds();
    out.push_back(t);
  }
  return out;
}

std::vector<std::vector<int32_t>> RandomPrompts(int n, int length, int32_t vocab_size,
                                                uint64_t seed) {
  std::mt19937_64 rng(seed);
  const uint64_t range = vocab_size > 1 ? static_cast<uint64_t>(vocab_size - 1) : 1;
  std::vector<std::vector<int32_t>> prompts(n);
  for (auto& p : prompts) {
    p.reserve(length);
    // The modulo bias is below 2^-40 for any real vocabulary: irrelevant here.
    for (int i = 0; i < length; ++i) p.push_back(1 + static_cast<int32_t>(rng() % range));
  }
  return prompts;
}

}  // namespace specula
