#include "engine/model/rope.h"

#include <cmath>
#include <numbers>

namespace specula {

std::vector<float> RopeInverseFrequencies(const ModelConfig& config) {
  const int64_t half = config.head_dim / 2;
  std::vector<float> inv(half);
  const RopeScaling& s = config.rope_scaling;
  for (int64_t i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(config.rope_theta, static_cast<double>(2 * i) / config.head_dim);
    switch (s.type) {
      case RopeScaling::Type::kNone:
        break;
      case RopeScaling::Type::kLinear:
        f /= s.factor;
        break;
      case RopeScaling::Type::kLlama3: {
        const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
        const double low_freq_wavelen = old_ctx / s.low_freq_factor;
        const double high_freq_wavelen = old_ctx / s.high_freq_factor;
        const double wavelen = 2.0 * std::numbers::pi / f;
        if (wavelen > low_freq_wavelen) {
          f /= s.factor;
        } else if (wavelen >= high_freq_wavelen) {
          const double smooth =
              (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
          f = (1.0 - smooth) * f / s.factor + smooth * f;
        }
        break;
      }
    }
    inv[i] = static_cast<float>(f);
  }
  return inv;
}

}  // namespace specula
