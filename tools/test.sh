#!/usr/bin/env bash
# Installs what the build needs, builds everything and runs every test. The README's test command
# and what CI runs. Extra arguments go to ctest (e.g. -R tokenizer); without any, the hardening
# stages follow (tools/hardening.sh: ASan + UBSan suites and the libFuzzer targets) unless
# SPECULA_QUICK=1.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
preset=${SPECULA_PRESET:-default}
cmake --preset "$preset"
cmake --build --preset "$preset" -j "$(nproc)"
build_dir=build
[[ $preset == default ]] || build_dir=build-$preset
# ctest counts a skipped test as passed; the summary after it says per label what really ran
# (a CUDA build without a GPU skips every `cuda` test).
status=0
ctest --preset "$preset" -j "$(nproc)" --output-junit "$PWD/$build_dir/ctest-junit.xml" "$@" ||
  status=$?
tools/ctest_summary.py "$build_dir" "$build_dir/ctest-junit.xml" || true
((status == 0)) || exit "$status"
if (($# == 0)) && [[ -z ${SPECULA_QUICK:-} && $preset == default ]]; then
  tools/hardening.sh
fi
