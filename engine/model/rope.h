// Rotary embedding frequencies, including the scaled variants of Hugging Face's rope_scaling.
#pragma once

#include <vector>

#include "engine/model/model_config.h"

namespace specula {

// inv_freq[i] = 1 / theta^(2i / head_dim) for i < head_dim / 2, then adjusted for the config's
// rope_scaling: `linear` divides every frequency by factor (positions / factor); `llama3` divides
// low frequencies by factor, keeps high ones and interpolates smoothly between.
std::vector<float> RopeInverseFrequencies(const ModelConfig& config);

}  // namespace specula
