#include "engine/sampling/row_sampling.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace specula {
namespace {

using sampling_internal::Candidate;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNegInf = -kInf;

// Total order used everywhere a "most likely first" order is needed: larger value first, then
// lower token id, so ties resolve the same way as greedy argmax. A function object rather than a
// function so the selection algorithms inline it.
struct BetterCandidate {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.value > b.value || (a.value == b.value && a.token < b.token);
  }
};
constexpr BetterCandidate Better;

// NaN would break the strict weak ordering the selection algorithms rely on (undefined behavior
// in nth_element), so a NaN logit ranks as impossible.
float Sanitize(float v) { return std::isnan(v) ? kNegInf : v; }

// Max over finite-or-infinite logits, ignoring NaN.
float MaxLogit(absl::Span<const float> logits) {
  float m = kNegInf;
  for (float v : logits) m = v > m ? v : m;
  return m;
}

// Writes the `k` best tokens of `logits` (by Better) into `out`, sorted best first. One pass plus
// occasional nth_element over a buffer of at most 2k entries, so it costs O(V) rather than the
// O(V log V) of sorting the vocabulary. Relies on scanning ids in increasing order: a later token
// whose logit only equals the current k-th best loses the tie and can be skipped.
void SelectTopK(absl::Span<const float> logits, size_t k, std::vector<Candidate>* out) {
  out->clear();
  k = std::min(k, logits.size());
  if (k == 0) return;
  const size_t capacity = std::max<size_t>(2 * k, 64);
  out->reserve(capacity);
  bool pruning = false;
  float threshold = kNegInf;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = Sanitize(logits[i]);
    if (pruning && !(v > threshold)) continue;
    out->push_back({v, static_cast<int32_t>(i)});
    if (out->size() == capacity) {
      std::nth_element(out->begin(), out->begin() + (k - 1), out->end(), Better);
      out->resize(k);
      threshold = out->back().value;
      pruning = true;
    }
  }
  if (out->size() > k) {
    std::nth_element(out->begin(), out->begin() + (k - 1), out->end(), Better);
    out->resize(k);
  }
  std::sort(out->begin(), out->end(), Better);
}

// Histogram buckets for top-p: the top 14 bits of a non-negative float (sign, exponent, 5
// mantissa bits) order the same way as the floats, and weights never exceed 1.0f.
constexpr int kBucketShift = 18;
constexpr size_t kNumBuckets = (std::bit_cast<uint32_t>(1.0f) >> kBucketShift) + 1;
size_t Bucket(float w) { return std::bit_cast<uint32_t>(w) >> kBucketShift; }

// Reorders `cands` so that its first k entries are the k most likely (by Better), where k is the
// smallest count whose weights sum to at least `nucleus` (all of them if none does), and returns
// k with that sum in `kept_total`. Bisects with nth_element and sorts only the final short block:
// it runs on the histogram's boundary bucket, which is usually small but is the whole vocabulary
// when all logits are equal, and this stays O(n) expected either way.
size_t NucleusPrefix(double nucleus, std::vector<Candidate>* cands, double* kept_total) {
  auto begin = cands->begin();
  size_t lo = 0;              // [0, lo): the lo best, all kept, summing to `acc` (< nucleus)
  size_t hi = cands->size();  // the answer lies in (lo, hi]
  double acc = 0.0;
  constexpr size_t kSortBelow = 64;
  while (hi - lo > kSortBelow) {
    const size_t mid = lo + (hi - lo) / 2;
    std::nth_element(begin + lo, begin + mid, begin + hi, Better);
    double block = 0.0;
    for (size_t i = lo; i < mid; ++i) block += (*cands)[i].value;
    if (acc + block >= nucleus) {
      hi = mid;
    } else {
      acc += block;
      lo = mid;
    }
  }
  std::sort(begin + lo, begin + hi, Better);
  size_t keep = lo;
  while (keep < hi) {
    acc += (*cands)[keep].value;
    ++keep;
    if (acc >= nucleus) break;
  }
  *kept_total = acc;
  return keep;
}

// Draws an index of `weights` (non-negative, `total` = their sum) with probability proportional
// to its weight. `u` is uniform in [0, 1). Falls back to the last positive weight when rounding
// leaves the target at or past the running sum.
template <typename WeightAt>
size_t DrawIndex(size_t count, WeightAt weight_at, double total, double u) {
  const double target = u * total;
  double cum = 0.0;
  size_t last_positive = 0;
  for (size_t i = 0; i < count; ++i) {
    const double w = weight_at(i);
    if (w <= 0.0) continue;
    cum += w;
    last_positive = i;
    if (target < cum) return i;
  }
  return last_positive;
}

}  // namespace

bool LogitsSampleable(absl::Span<const float> logits) {
  bool some_finite = logits.empty();
  for (const float v : logits) {
    if (!(v < kInf)) return false;  // NaN or +inf
    some_finite = some_finite || v > kNegInf;
  }
  return some_finite;
}

void MaskRow(absl::Span<float> logits, const uint32_t* bits) {
  const auto n = static_cast<int64_t>(logits.size());
  for (int64_t w = 0; w * 32 < n; ++w) {
    if (bits[w] == ~uint32_t{0}) continue;  // all 32 allowed
    const int64_t end = std::min(n, w * 32 + 32);
    for (int64_t t = w * 32; t < end; ++t) {
      // NaN and +inf fail `<`: they stay for the sampler to report.
      if (!((bits[w] >> (t & 31)) & 1) && logits[t] < kInf) logits[t] = kNegInf;
    }
  }
}

// Shifted by the max so large logits cannot overflow.
float RowSampler::LogSumExp(absl::Span<const float> logits) {
  const float m = MaxLogit(logits);
  if (!std::isfinite(m)) return m;
  double sum = 0.0;
  for (float v : logits) sum += std::exp(v - m);
  return static_cast<float>(m + std::log(sum));
}

void RowSampler::TopLogprobs(absl::Span<const float> logits, int32_t n, float log_z,
                             std::vector<TokenLogprob>* out) {
  out->clear();
  if (n <= 0) return;
  SelectTopK(logits, static_cast<size_t>(n), &candidates_);
  out->reserve(candidates_.size());
  for (const Candidate& c : candidates_) out->push_back({c.token, c.value - log_z});
}

int32_t RowSampler::Choose(const RowSampling& row, absl::Span<const float> logits) {
  if (row.temperature > 0.0f) return Draw(row, logits);
  // Greedy: one pass; strict '>' keeps the lowest id among equal maxima.
  float best = kNegInf;
  int32_t token = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] > best) {
      best = logits[i];
      token = static_cast<int32_t>(i);
    }
  }
  return token;
}

double RowSampler::KeepNucleus(const RowSampling& row, absl::Span<const float> logits,
                               float max_logit) {
  // A histogram of probability mass over the weights' float bit patterns (monotonic for
  // non-negative floats, 32 buckets per octave) finds the bucket where the nucleus ends. Tokens
  // above it are in, tokens below are out, and only that one bucket needs ordering to decide
  // which of its tokens are in; the kept tokens alone are then ranked for the draw.
  const size_t vocab = logits.size();
  const float inv_t = 1.0f / row.temperature;
  weights_.resize(vocab);
  bucket_mass_.assign(kNumBuckets, 0.0);
  double total = 0.0;
  for (size_t i = 0; i < vocab; ++i) {
    if (!(logits[i] > kNegInf)) {  // -inf or NaN: weight 0 (a grammar's mask refuses most)
      weights_[i] = 0.0f;
      continue;
    }
    const float w = std::exp((logits[i] - max_logit) * inv_t);
    weights_[i] = w;
    total += w;
    bucket_mass_[Bucket(w)] += w;
  }
  const double nucleus = static_cast<double>(row.top_p) * total;
  size_t boundary = 0;
  double above = 0.0;  // mass of the buckets above `boundary`
  for (size_t b = kNumBuckets; b-- > 0;) {
    if (above + bucket_mass_[b] >= nucleus) {
      boundary = b;
      break;
    }
    above += bucket_mass_[b];
  }
  // Tokens below min_p are collected by neither list: they rank after every kept token.
  std::vector<Candidate>& edge = boundary_candidates_;
  edge.clear();
  double kept_total = 0.0;
  for (size_t i = 0; i < vocab; ++i) {
    const float w = weights_[i];
    if (w < row.min_p || w <= 0.0f) continue;
    const size_t b = Bucket(w);
    if (b > boundary) {
      candidates_.push_back({w, static_cast<int32_t>(i)});
      kept_total += w;
    } else if (b == boundary) {
      edge.push_back({w, static_cast<int32_t>(i)});
    }
  }
  double edge_total = 0.0;
  const size_t edge_keep = NucleusPrefix(nucleus - above, &edge, &edge_total);
  candidates_.insert(candidates_.end(), edge.begin(), edge.begin() + edge_keep);
  // The draw walks the nucleus ranked most likely first, by logit then id, as on the device.
  std::sort(candidates_.begin(), candidates_.end(), [&](const Candidate& a, const Candidate& b) {
    const float la = Sanitize(logits[a.token]);
    const float lb = Sanitize(logits[b.token]);
    return la > lb || (la == lb && a.token < b.token);
  });
  return kept_total + edge_total;
}

int32_t RowSampler::Draw(const RowSampling& row, absl::Span<const float> logits) {
  const size_t vocab = logits.size();
  const float max_logit = MaxLogit(logits);
  // All tokens masked (or a +inf logit): there is no distribution to draw from.
  if (!std::isfinite(max_logit)) {
    for (size_t i = 0; i < vocab; ++i) {
      if (logits[i] == max_logit) return static_cast<int32_t>(i);
    }
    return 0;
  }
  const float inv_t = 1.0f / row.temperature;
  // Weights are probabilities relative to the most likely token (which gets exactly 1, all others
  // land in [0, 1]), so the min-p test is a plain comparison with min_p.
  auto weight = [&](float logit) { return std::exp((Sanitize(logit) - max_logit) * inv_t); };

  const bool top_k = row.top_k > 0 && static_cast<size_t>(row.top_k) < vocab;
  const bool top_p = row.top_p < 1.0f;
  std::vector<Candidate>& cands = candidates_;
  cands.clear();
  double kept_total = 0.0;
  if (top_k) {
    SelectTopK(logits, static_cast<size_t>(row.top_k), &cands);
    double top_k_total = 0.0;
    for (Candidate& c : cands) {
      c.value = weight(c.value);
      top_k_total += c.value;
    }
    // Ranked already: walk most likely first to the nucleus (a fraction of the top-k mass, as
    // when top-p follows top-k in HF) or the min-p cut.
    const double nucleus = static_cast<double>(row.top_p) * top_k_total;
    size_t keep = 0;
    while (keep < cands.size()) {
      const Candidate& c = cands[keep];
      if (keep > 0 && c.value < row.min_p) break;
      kept_total += c.value;
      ++keep;
      if (top_p && kept_total >= nucleus) break;
    }
    cands.resize(keep);
  } else if (top_p) {
    kept_total = KeepNucleus(row, logits, max_logit);
  } else {
    // No ordering needed: plain temperature sampling in id order, filtered by min-p when set.
    for (size_t i = 0; i < vocab; ++i) {
      if (!(logits[i] > kNegInf)) continue;  // weight 0: a masked token costs no exp
      const float w = weight(logits[i]);
      if (w >= row.min_p && w > 0.0f) {
        cands.push_back({w, static_cast<int32_t>(i)});
        kept_total += w;
      }
    }
  }
  if (cands.empty()) return 0;
  auto weight_at = [&](size_t i) { return cands[i].value; };
  return cands[DrawIndex(cands.size(), weight_at, kept_total, row.uniform)].token;
}

SampledRow RowSampler::Sample(const RowSampling& row, absl::Span<const float> logits) {
  SampledRow out;
  if (!LogitsSampleable(logits)) {
    out.status = RowSampleStatus::kNonFinite;
    return out;
  }
  out.token = Choose(row, logits);
  if (row.logprobs < 0 || logits.empty()) return out;
  const float log_z = LogSumExp(logits);
  out.logprob = logits[out.token] - log_z;
  TopLogprobs(logits, std::min(row.logprobs, kMaxSampledAlternatives), log_z, &alternatives_);
  out.alternatives = static_cast<int32_t>(alternatives_.size());
  for (size_t i = 0; i < alternatives_.size(); ++i) {
    out.alternative_tokens[i] = alternatives_[i].token;
    out.alternative_logprobs[i] = alternatives_[i].logprob;
  }
  return out;
}

}  // namespace specula
