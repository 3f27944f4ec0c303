#include "engine/model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace specula {
namespace {

// transformers 5, modeling_rope_utils.py, _compute_llama3_parameters: low frequencies divided by
// factor, high ones kept, the band between interpolated smoothly.
double Llama3(double f, const RopeScaling& s) {
  const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_ctx / s.low_freq_factor;
  const double high_freq_wavelen = old_ctx / s.high_freq_factor;
  const double wavelen = 2.0 * std::numbers::pi / f;
  if (wavelen > low_freq_wavelen) return f / s.factor;
  if (wavelen < high_freq_wavelen) return f;
  const double smooth =
      (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1.0 - smooth) * f / s.factor + smooth * f;
}

// transformers 5, modeling_rope_utils.py, _compute_yarn_parameters, find_correction_dim: the
// dimension whose wavelength fits `rotations` times into the original context.
double YarnCorrectionDim(double rotations, double dim, double base, double original_context) {
  return dim * std::log(original_context / (rotations * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(base));
}

}  // namespace

YarnRamp YarnCorrectionRange(const ModelConfig& config) {
  const RopeScaling& s = config.rope_scaling;
  const double dim = static_cast<double>(config.head_dim);
  const double ctx = static_cast<double>(s.original_max_position_embeddings);
  double low = YarnCorrectionDim(s.beta_fast, dim, config.rope_theta, ctx);
  double high = YarnCorrectionDim(s.beta_slow, dim, config.rope_theta, ctx);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
  return {low, high};
}

std::vector<float> RopeInverseFrequencies(const ModelConfig& config) {
  const int64_t half = config.head_dim / 2;
  std::vector<float> inv(half);
  const RopeScaling& s = config.rope_scaling;
  const YarnRamp ramp = s.type == RopeScaling::Type::kYarn ? YarnCorrectionRange(config)
                                                           : YarnRamp{};
  for (int64_t i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(config.rope_theta, static_cast<double>(2 * i) / config.head_dim);
    switch (s.type) {
      case RopeScaling::Type::kNone:
        break;
      case RopeScaling::Type::kLinear:
        f /= s.factor;
        break;
      case RopeScaling::Type::kLlama3:
        f = Llama3(f, s);
        break;
      case RopeScaling::Type::kYarn: {
        // Kept (extrapolated) for the high frequencies below the ramp's start, divided by factor
        // (interpolated) past its end, blended linearly between.
        const double t = std::clamp((static_cast<double>(i) - ramp.low) / (ramp.high - ramp.low),
                                    0.0, 1.0);
        f = f / s.factor * t + f * (1.0 - t);
        break;
      }
    }
    inv[i] = static_cast<float>(f);
  }
  return inv;
}

}  // namespace specula
