#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/check.sh unpacked the bundle in /tmp/specula-gpu:
#   tools/gpu/sparse_bench.sh REPORT_DIR [CONTEXTS]   (CONTEXTS default "8192 32768")
# Issue 37's items 1 and 2 on a random-weight Llama-3.2-1B-shaped bf16 checkpoint, through gRPC
# at batch 1: time per output token after each context, dense against sparse with a budget past
# the context (every page resident, selection still run: item 2's <= 1.1x) and at a 12.5% budget
# under miss_policy defer (corrections 0.75, the default, and 0) and fetch. For each sparse run,
# the counters' change over it from /metrics: pages hit / missed / late / corrected, bytes
# copied ahead and read at use, the stall (the device's, from timing events around its waits;
# first GPU reading) and the engine thread's wait for the device (these sums include the
# warm-up and the prefills, so compare them between runs, not as decode-only figures). CUDA
# graphs are off in every run: only dense steps are ever recorded, which would favour the dense
# baseline. About 4 minutes.
set -uo pipefail
report=$1
contexts=${2:-"8192 32768"}
mkdir -p "$report"
bundle=${bundle:-/tmp/specula-gpu}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/env.sh"

# DEVICE and MODEL (a model directory instead of the generated 1B) let a CPU machine dry-run it.
device=${DEVICE:-cuda}
model=${MODEL:-/tmp/specula-1b}
[[ -n ${MODEL:-} ]] || make_1b_model "$model" "$report/model.log" || exit 1

port=50191
metrics_port=50192
counters() {  # the sparse and step counters, "name value" per line, from /metrics
  metric_values "$metrics_port" specula_prefetch_hits_total specula_prefetch_misses_total \
    specula_prefetch_late_total specula_prefetch_corrections_total specula_prefetch_bytes_total \
    specula_decode_fetch_bytes_total specula_decode_stall_seconds_total \
    specula_step_device_wait_seconds_sum specula_step_duration_seconds_sum \
    specula_generation_tokens_total
}
delta() {  # delta BEFORE AFTER: each counter's change, one line
  python3 - "$1" "$2" <<'PY'
import sys
def parse(s): return {l.split()[0]: float(l.split()[1]) for l in s.splitlines() if l.strip()}
b, a = parse(sys.argv[1]), parse(sys.argv[2])
d = {k: a[k] - b.get(k, 0) for k in a}
short = lambda k: k.replace("specula_", "").replace("_total", "").replace("_seconds_sum", "_s")
print("Counters:", ", ".join(f"{short(k)} {d[k]:.4g}" for k in sorted(d)))
PY
}
run() {  # run LABEL CONTEXT SPARSE_YAML: a server with that sparse section, batch 1 at CONTEXT
  local label=$1 n=$2 sparse=$3
  label=$label-$n
  cat >"$report/server-$label.yaml" <<YAML
model: {path: $model, device: $device, cuda_graphs: false}
server: {listen: "127.0.0.1:$port", metrics_listen: "127.0.0.1:$metrics_port"}
kv_cache: {capacity_tokens: 98304, host_capacity_tokens: 70000}
scheduler: {max_running_requests: 4}
sparse: $sparse
YAML
  start_server "$label" $port || return 1
  local pid=$server_pid
  echo "-- $label, prompt $n"
  local before after
  before=$(counters)
  timeout 150 "$bundle/bin/specula-bench" serve --server 127.0.0.1:$port --server-pid $pid \
    --warmup 1 --input-len "$n" --output-len 128 --num-prompts 2 --concurrency 1 2>&1 |
    grep -E "TPOT|ITL|Output token|ailed|rror"
  after=$(counters)
  delta "$before" "$after"
  kill -TERM $pid
  wait $pid
}
{
  echo "== batch 1, 12.5% budget (sparse.budget_tokens = context / 8 per run)"
  for n in $contexts; do
    b=$((n / 8))
    s="enabled: true, budget_tokens: $b, min_context_tokens: 0"
    run dense $n "{enabled: false}"
    # Item 2: every page resident (a budget past the context and the output), selection still run.
    run full $n "{enabled: true, budget_tokens: $((n + 512)), min_context_tokens: 0, miss_policy: defer}"
    run defer $n "{$s, miss_policy: defer}"
    run defer-uncorrected $n "{$s, miss_policy: defer, miss_correction: 0}"
    run fetch $n "{$s, miss_policy: fetch}"
  done
} 2>&1 | tee "$report/sparse.md"
