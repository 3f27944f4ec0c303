// The stateless half of sampling: one row of logits and its RowSampling (kernels/sampling_abi.h)
// give a token and its logprobs. The per-sequence Sampler (sampler.h) adds the state (random
// stream, penalties); the CPU backend's SampleRows runs this for each row, and the CUDA kernel
// (kernels/sampling.cu) is tested against it.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "kernels/sampling_abi.h"

namespace specula {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

namespace sampling_internal {
// A candidate token: `value` is a logit or an unnormalized probability, depending on the stage.
struct Candidate {
  float value;
  int32_t token;
};
}  // namespace sampling_internal

// Whether a row of logits has a token to give: no NaN, no +infinity (a model that overflowed),
// and at least one finite logit. -infinity is a token never chosen (a grammar's mask writes it),
// not an error.
bool LogitsSampleable(absl::Span<const float> logits);

// A grammar's mask on one row: logits[t] = -infinity where bit t % 32 of bits[t / 32] is clear
// (`bits` holds ceil(logits.size() / 32) words). NaN and +infinity stay, so the row still fails
// LogitsSampleable. The reference of Backend::MaskLogits, and the host path's mask.
void MaskRow(absl::Span<float> logits, const uint32_t* bits);

// Keeps scratch buffers across rows so that a steady stream of rows allocates nothing. Not
// thread-safe; one per thread.
class RowSampler {
 public:
  // The token `row` chooses from `logits`: the argmax when row.temperature is 0, else the draw
  // row.uniform makes (see kernels/sampling_abi.h for the method). NaN logits are never chosen.
  int32_t Choose(const RowSampling& row, absl::Span<const float> logits);

  // log(sum(exp(logits))), the log_softmax normalizer.
  static float LogSumExp(absl::Span<const float> logits);

  // The `n` most likely tokens (ties: lower id first) with their logprobs (logit - log_z).
  void TopLogprobs(absl::Span<const float> logits, int32_t n, float log_z,
                   std::vector<TokenLogprob>* out);

  // Choose plus the logprobs row.logprobs asks for, as the device reports them. The logits must
  // be finite (a row with NaN or infinity gets status kNonFinite and token 0).
  SampledRow Sample(const RowSampling& row, absl::Span<const float> logits);

 private:
  using Candidate = sampling_internal::Candidate;

  // Temperature > 0: temperature, top-k, top-p, min-p, then the inverse-CDF draw at `uniform`.
  int32_t Draw(const RowSampling& row, absl::Span<const float> logits);
  // Top-p without top-k: fills candidates_ with the nucleus (min-p applied), ranked; returns its
  // weight.
  double KeepNucleus(const RowSampling& row, absl::Span<const float> logits, float max_logit);

  std::vector<Candidate> candidates_;
  std::vector<Candidate> boundary_candidates_;
  std::vector<TokenLogprob> alternatives_;
  std::vector<float> weights_;
  std::vector<double> bucket_mass_;
};

}  // namespace specula
