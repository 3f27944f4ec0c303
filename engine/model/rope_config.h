// The rotary embedding's settings in config.json, in either of the forms transformers writes:
// transformers 5's `rope_parameters` {rope_type, rope_theta, factor, ...}, or transformers 4's
// top-level `rope_theta` plus `rope_scaling`. Internal to engine/model (model_config.cc).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/model/config_reader.h"
#include "engine/model/model_config.h"

namespace specula::model_internal {

struct RopeSettings {
  double theta = 10000.0;
  RopeScaling scaling;
};

// Reads both forms from the config's top-level object. A setting present in both forms must
// agree (an error names both keys); one present in only one form is taken from it. Every key
// inside the parameters is honoured or refused: unknown keys, unsupported rope types (dynamic,
// longrope, ...), partial rotary embeddings and the per-layer-type nested form are errors that
// name the key. `max_position_embeddings` is yarn's default original context, as in
// transformers' standardize_rope_params.
absl::StatusOr<RopeSettings> ParseRopeSettings(const Json& root, const ConfigReader& top,
                                               int64_t max_position_embeddings);

}  // namespace specula::model_internal
