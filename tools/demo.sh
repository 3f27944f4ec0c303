#!/usr/bin/env bash
# Installs, builds and shows specula answering on its embedded default model (a tiny random-weight
# Llama-3-style model the project generates itself; its text is gibberish by design).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
preset=${SPECULA_PRESET:-default}
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)" --target specula-cli
build_dir=build
[[ $preset == cpu ]] && build_dir=build-cpu
"$build_dir/tools/specula-cli" generate --offline --prompt "${1:-Hello, specula!}" --max_tokens 32 --temperature 0.8 --seed 1
