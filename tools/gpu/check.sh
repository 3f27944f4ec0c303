#!/usr/bin/env bash
# Runs on the GPU machine, from a bundle made by tools/gpu/bundle.sh:
#   tools/gpu/check.sh BUNDLE_DIR REPORT_DIR   (BUNDLE_DIR holds specula-gpu.tar.xz)
# Runs the CUDA tests (every kernel against the CPU backend; greedy generation against the CPU),
# the same tests under compute-sanitizer memcheck, and an end-to-end server check with
# --device cuda, then writes REPORT_DIR/report.md and report.json. Exit status: 0 when every
# check passed. One call, well under the device tool's 10 minutes.
set -uo pipefail
report=$2
mkdir -p "$report"
bundle=/tmp/specula-gpu
rm -rf "$bundle" && mkdir -p "$bundle"
tar -C "$bundle" -xJf "$1/specula-gpu.tar.xz" || { echo "no bundle in $1" >&2; exit 2; }

source "$(dirname "$0")/env.sh"
export SPECULA_CACHE_DIR=$report/cache

declare -A result
order=()
run() {  # run NAME COMMAND...: logs to REPORT_DIR/NAME.log, records pass/fail
  local name=$1
  shift
  local start=$SECONDS
  order+=("$name")
  if "$@" >"$report/$name.log" 2>&1; then result[$name]="pass"; else result[$name]="FAIL"; fi
  echo "$name: ${result[$name]} ($((SECONDS - start)) s)"
}

# Without a GPU every CUDA test skips and "passes": a missing GPU fails the check itself.
run gpu nvidia-smi -L
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
  --format=csv >"$report/gpu.csv" 2>&1 || true
run factory "$bundle/bin/cpu_backend_test" --gtest_filter='BackendFactory*'
run kernels "$bundle/bin/cuda_backend_test" --gtest_output="json:$report/kernels.json"
run generate "$bundle/bin/cuda_generate_test" --gtest_output="json:$report/generate.json"
# A failure again with every kernel launched after the one ahead ends (kernels/launch_policy.h):
# if it passes so, the fault is in the order of the dependent launches (docs/CUDA.md).
for suite in kernels generate; do
  if [[ ${result[$suite]} == FAIL ]]; then
    binary=cuda_backend_test
    [[ $suite == generate ]] && binary=cuda_generate_test
    run "$suite-ordinary-launches" env SPECULA_DEPENDENT_LAUNCHES=0 "$bundle/bin/$binary" \
      --gtest_output="json:$report/$suite-ordinary-launches.json"
  fi
done
if command -v compute-sanitizer >/dev/null; then
  run memcheck compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$bundle/bin/cuda_backend_test" \
    --gtest_filter='*F32_d64_g4*:*TileKernel*BF16_d64_g4*:*TileKernel*F16_d128_g8*:CudaBackendTest.*:*CudaSparseOpsTest*-*LongLists*'
  run racecheck compute-sanitizer --tool racecheck --error-exitcode 1 \
    "$bundle/bin/cuda_backend_test" --gtest_filter='*BF16_d128_g4*:*TileKernel*BF16_d64_g1*:*CudaSparseOpsTest*'
fi

# End to end: the server on the GPU answers a generation over gRPC, with model.device cuda and
# with auto (the default), which must choose the GPU (issue 31) and log why.
server_check() {  # server_check DEVICE
  local log=$report/server-$1.log
  "$bundle/bin/specula-server" --device "$1" --model "$bundle/test_models/llama3-bf16" \
    --listen 127.0.0.1:50151 --metrics-listen "" --log-level info >"$log" 2>&1 &
  local pid=$!
  wait_healthy "$pid" 50151 || { kill -TERM "$pid" 2>/dev/null; cat "$log"; return 1; }
  "$bundle/bin/specula-cli" info --server 127.0.0.1:50151 &&
    "$bundle/bin/specula-cli" generate --server 127.0.0.1:50151 --prompt_ids 1,2,3,4,5 \
      --max-tokens 16
  local status=$?
  kill -TERM "$pid"
  wait "$pid" || status=1
  grep -E 'event=(backend_selected|model_loaded)' "$log"
  grep -q 'event=backend_selected device=cuda' "$log" || { echo "did not choose cuda"; status=1; }
  return $status
}
run server server_check cuda
run auto server_check auto

# Issue 12's target on the GPU: sessions in the KV pool and offloaded to pinned host memory, and
# the TTFT of a turn's new tokens after 0, 576 and 1440 cached tokens (the log has the tables).
run agent "$bundle/bin/specula-bench" agent --device cuda --modes=session,offload \
  --suffix-probe-repeats=9 --work_dir /tmp/specula-agent-work

{
  echo "# specula GPU check, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo '```'
  cat "$report/gpu.csv"
  echo '```'
  echo
  echo "| check | result |"
  echo "|---|---|"
  for name in "${order[@]}"; do echo "| $name | ${result[$name]} |"; done
} >"$report/report.md"
{
  echo "{"
  first=1
  for name in "${order[@]}"; do
    (( first )) || echo ","
    first=0
    printf '  "%s": "%s"' "$name" "${result[$name]}"
  done
  echo
  echo "}"
} >"$report/report.json"
cat "$report/report.md"
for r in "${result[@]}"; do [[ $r == pass ]] || exit 1; done
