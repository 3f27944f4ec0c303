// Rotary embedding frequencies, including the scaled variants of Hugging Face's rope_parameters
// (rope_scaling in transformers 4).
#pragma once

#include <vector>

#include "engine/model/model_config.h"

namespace specula {

// inv_freq[i] = 1 / theta^(2i / head_dim) for i < head_dim / 2, then adjusted for the config's
// scaling: `linear` divides every frequency by factor (positions / factor); `llama3` divides
// low frequencies by factor, keeps high ones and interpolates smoothly between; `yarn` blends
// the divided and the kept frequency along YarnCorrectionRange. Yarn's attention factor is not
// here: it scales the softmax (ModelConfig::softmax_scale).
std::vector<float> RopeInverseFrequencies(const ModelConfig& config);

// Yarn's ramp over dimension pairs i: t(i) = clamp((i - low) / (high - low), 0, 1) of the
// interpolated frequency.
struct YarnRamp {
  double low = 0;
  double high = 1;
};
YarnRamp YarnCorrectionRange(const ModelConfig& config);

}  // namespace specula
