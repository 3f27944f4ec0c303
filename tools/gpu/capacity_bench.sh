#!/usr/bin/env bash
# Issue 37 item 3, the capacity benchmark: what the sparse KV cache exists for. Runs after
# tools/gpu/check.sh unpacked the bundle in /tmp/specula-gpu:
#   tools/gpu/capacity_bench.sh REPORT_DIR [SHAPES]   (SHAPES default "1b"; "1b 8b" adds the 8B)
# The device KV (kv_cache.capacity_tokens) holds 2 requests' context + output, so dense runs 2 at
# a time while sparse (budget BUDGET) runs every request at once from the host store. REQUESTS
# agent sessions with a PROMPT-token context (1B: 64K, ~35 GB of host KV; 8B: 32K, ~70 GB): each
# context is prefilled by a first turn (max_tokens 1, all sent at once), then the measured second
# turns, all at once: the context (reused: sparse in place in the host store, dense reloaded from
# it into the device KV) and SUFFIX new tokens, OUTPUT tokens each. Then one SINGLE-token request
# sparse against one SHORT-token request dense (time per output token). Per run: the bench's
# figures for the second turns (whole-run), the first turns' time, the decode phase's aggregate
# tok/s (tokens decoded by decode-only steps over those steps' time: prefill excluded), the time
# split by step kind, hit / miss / late / corrected pages, host->device bytes per generated
# token, stall and preemptions (from /metrics, over both turns: a first turn decodes nothing),
# and the server's kv_seconds (the KV pool and pinning the host store at startup). Defaults are the issue's; the environment overrides them
# (PROMPT, SUFFIX, OUTPUT, REQUESTS, BUDGET, SINGLE, SHORT, DEVICE, MODEL: a model directory to use
# instead of generating one; bundle: the unpacked bundle), so a CPU machine can run it small.
# About 3-4 minutes for the 1B on an H200 with the tiled prefill kernel.
set -uo pipefail
report=$1
shapes=${2:-1b}
mkdir -p "$report"
bundle=${bundle:-/tmp/specula-gpu}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/env.sh"
device=${DEVICE:-cuda}
requests=${REQUESTS:-16}
output=${OUTPUT:-512}
suffix=${SUFFIX:-64}
budget=${BUDGET:-2048}
single=${SINGLE:-130560}  # 128K context with the output, within the 1B's 131072 positions
short=${SHORT:-4096}
port=50193
metrics_port=50194

counters() {  # "name[:kind] value" per line for the families the report reads
  metric_values "$metrics_port" specula_step_seconds_total specula_step_decoded_tokens_total \
    specula_steps_total specula_generation_tokens_total specula_prefetch_hits_total \
    specula_prefetch_misses_total specula_prefetch_late_total \
    specula_prefetch_corrections_total specula_prefetch_bytes_total \
    specula_decode_fetch_bytes_total specula_decode_stall_seconds_total \
    specula_preemptions_total specula_step_device_wait_seconds_sum
}
summary() {  # summary BEFORE AFTER: the run's decode phase and sparse counters, from the deltas
  python3 - "$1" "$2" <<'PY'
import sys
def parse(s): return {l.rsplit(" ", 1)[0]: float(l.rsplit(" ", 1)[1]) for l in s.splitlines() if l.strip()}
b, a = parse(sys.argv[1]), parse(sys.argv[2])
if not a:
    sys.exit("no counters after the run: the server's /metrics did not answer (did it die?)")
d = {k: a[k] - b.get(k, 0) for k in a}
g = lambda k: d.get(k, 0.0)
sec = {k: g(f"specula_step_seconds_total:{k}") for k in ("decode", "mixed", "prefill")}
dec = g("specula_step_decoded_tokens_total:decode")
mixed = g("specula_step_decoded_tokens_total:mixed")
steps = g("specula_steps_total:decode")
print(f"Decode phase: {dec / sec['decode'] if sec['decode'] else 0:.1f} tok/s "
      f"({dec:.0f} tokens in {sec['decode']:.2f} s of {steps:.0f} decode-only steps, mean batch "
      f"{dec / steps if steps else 0:.1f}; {mixed:.0f} more "
      f"decoded beside prompt work in {sec['mixed']:.2f} s of mixed steps; prefill-only steps "
      f"{sec['prefill']:.2f} s)")
gen = g("specula_generation_tokens_total")
hits, miss, late = (g(f"specula_prefetch_{k}_total") for k in ("hits", "misses", "late"))
sel = hits + miss + late
moved = g("specula_prefetch_bytes_total") + g("specula_decode_fetch_bytes_total")
print(f"Sparse: hit {hits / sel if sel else 0:.3f}, miss {miss / sel if sel else 0:.3f}, "
      f"late {late / sel if sel else 0:.3f} of {sel:.0f} selected pages; corrected "
      f"{g('specula_prefetch_corrections_total'):.0f}; host->device "
      f"{moved / gen / 1e3 if gen else 0:.1f} KB per generated token "
      f"({g('specula_decode_fetch_bytes_total') / 1e9:.2f} GB read at use); stall "
      f"{g('specula_decode_stall_seconds_total'):.2f} s; device wait "
      f"{g('specula_step_device_wait_seconds_sum'):.2f} s; preemptions "
      f"{g('specula_preemptions_total'):.0f}")
PY
}
# run LABEL PROMPT N OUT SUFFIX KV_CACHE_YAML SPARSE_YAML: a server with those sections, N
# concurrent requests of PROMPT tokens (SUFFIX > 0: sessions' second turns, SUFFIX new tokens
# after a PROMPT-token first turn) and OUT output tokens, its figures.
run() {
  local label=$1 prompt=$2 n=$3 out=$4 suffix=$5 kv=$6 sparse=$7
  cat >"$report/server-$label.yaml" <<YAML
model: {path: $model, device: $device}
server: {listen: "127.0.0.1:$port", metrics_listen: "127.0.0.1:$metrics_port"}
kv_cache: $kv
scheduler: {max_running_requests: $n, max_waiting_requests: $n}
sparse: $sparse
YAML
  # Pinning tens of GB of host store takes a while: up to 3 minutes to become healthy.
  start_server "$label" $port 3 || return 1
  local pid=$server_pid
  echo "-- $label: $n x $prompt context + $suffix new / $out output tokens; kv_cache $kv; sparse $sparse"
  grep -o "kv_seconds=[0-9.e+-]*" "$report/server-$label.log" | head -1
  local before after
  before=$(counters)
  timeout 600 "$bundle/bin/specula-bench" serve --server 127.0.0.1:$port --server-pid $pid \
    --warmup 0 --input-len "$prompt" --output-len "$out" --num-prompts "$n" --concurrency "$n" \
    --session-suffix-len "$suffix" 2>&1 | tee "$report/bench-$label.log" |
    grep -E "^sessions|Successful|Failed req|duration|input tokens|Output token|TTFT|TPOT|ITL"
  after=$(counters)
  summary "$before" "$after"
  kill -TERM $pid
  wait $pid
}

for shape in $shapes; do
  case $shape in
    1b) model=${MODEL:-/tmp/specula-1b}; prompt=${PROMPT:-65536}
        [[ -n ${MODEL:-} ]] || make_1b_model "$model" "$report/model-1b.log" || exit 1 ;;
    8b) model=/tmp/specula-8b; prompt=${PROMPT:-32768}
        make_1b_model /tmp/specula-1b "$report/model-1b.log" || exit 1
        [[ -e $model/config.json ]] ||
          python3 "$here/make_8b_checkpoint.py" /tmp/specula-1b "$model" >"$report/model-8b.log" 2>&1 ||
          { echo "8B checkpoint failed"; tail -5 "$report/model-8b.log"; exit 1; } ;;
    *) echo "unknown shape $shape (1b | 8b)"; exit 2 ;;
  esac
  # Two requests' context, suffix and output, and a page of slack for each; the host store holds
  # every session's (dense sessions wait there between turns, as sparse ones do). The slack is
  # about a page a request: dense admits a third request only when one of two ends, and neither
  # preempts the other as it grows; sparse second turns find the pages they grow into (about 36
  # a KV head and layer each at 512 output tokens) among the ~600 the first turns leave free.
  capacity=$((2 * (prompt + suffix + output + 16)))
  host=$((requests * (prompt + suffix + output + 16)))
  sparse="{enabled: true, budget_tokens: $budget, min_context_tokens: 0}"
  {
    echo "== $shape: $requests concurrent sessions' second turns, device KV for 2 ($capacity tokens)"
    run "$shape-dense" "$prompt" "$requests" "$output" "$suffix" \
      "{capacity_tokens: $capacity, host_capacity_tokens: $host}" "{enabled: false}"
    run "$shape-sparse" "$prompt" "$requests" "$output" "$suffix" \
      "{capacity_tokens: $capacity, host_capacity_tokens: $host}" "$sparse"
    echo "== $shape: one request, sparse at $single tokens against dense at $short"
    run "$shape-dense-short" "$short" 1 256 0 "{capacity_tokens: $((short + 512))}" \
      "{enabled: false}"
    run "$shape-sparse-single" "$single" 1 256 0 \
      "{capacity_tokens: $capacity, host_capacity_tokens: $((single + 512))}" "$sparse"
  } 2>&1 | tee "$report/capacity-$shape.md"
done
