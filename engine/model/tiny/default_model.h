// The embedded default model: the tiny generated Llama-3-style model the server and the CLI use
// when no --model is given. Nothing is downloaded; it is written on first use.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace specula {

// Directory holding the default model, writing it first if it is not there yet. The cache root
// is $SPECULA_CACHE_DIR, else $XDG_CACHE_HOME/specula, else $HOME/.cache/specula, else /tmp.
// Safe against concurrent callers: the model is written to a temporary directory and renamed.
absl::StatusOr<std::string> EnsureDefaultModel();

}  // namespace specula
