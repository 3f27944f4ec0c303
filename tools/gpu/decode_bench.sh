#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/check.sh unpacked the bundle in /tmp/specula-gpu:
#   tools/gpu/decode_bench.sh REPORT_DIR [CUDA_GRAPHS [DEPENDENT_LAUNCHES]]
#   (model.cuda_graphs and model.dependent_launches, both default true)
# Decode figures of issue 35 for a random-weight Llama-3.2-1B-shaped bf16 checkpoint, with the
# card's copy bandwidth measured in the same call (the floor is weight + KV bytes over it):
#   - batch-1 time per output token after 1K, 8K and 32K prompt tokens;
#   - steady output tok/s at concurrency 1, 8, 32, 64 with 1K prompts;
# all through gRPC (`specula-bench serve --server-pid`, which also reports the server's CPU), each
# with the host's share of step time: steps' wall time less the engine thread's wait for the
# device at the readback (specula_step_duration_seconds - specula_step_device_wait_seconds,
# from /metrics before and after the run).
set -uo pipefail
report=$1
cuda_graphs=${2:-true}
dependent_launches=${3:-true}
mkdir -p "$report"
bundle=/tmp/specula-gpu
here=$(cd "$(dirname "$0")" && pwd)
source "$here/env.sh"

model=/tmp/specula-1b
make_1b_model "$model" "$report/model.log" || exit 1

echo "== the card"
timeout 60 python3 - <<'PY' 2>&1 | tee "$report/card.md"
import torch
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(20): y.copy_(x)
end.record(); torch.cuda.synchronize()
seconds = start.elapsed_time(end) / 1e3 / 20
print(f"copy bandwidth (read + write): {2 * x.numel() / seconds / 1e9:.0f} GB/s")
PY

port=50181
metrics_port=50182
cat >"$report/server.yaml" <<YAML
model: {path: $model, device: cuda, cuda_graphs: $cuda_graphs, dependent_launches: $dependent_launches}
server: {listen: "127.0.0.1:$port", metrics_listen: "127.0.0.1:$metrics_port"}
kv_cache: {capacity_tokens: 98304}
scheduler: {max_running_requests: 64}
YAML
"$bundle/bin/specula-server" --config "$report/server.yaml" >"$report/server.log" 2>&1 &
pid=$!
wait_healthy $pid $port || { echo "server not serving"; tail -5 "$report/server.log"; exit 1; }

step_sums() {  # the step duration's and device wait's sums and the step count, from /metrics
  python3 - "$metrics_port" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
v = {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l.startswith("specula_step_")}
print(v["specula_step_duration_seconds_sum"], v["specula_step_device_wait_seconds_sum"],
      v["specula_step_duration_seconds_count"])
PY
}
serve() {  # serve LABEL ARGS...: one specula-bench serve run, its key lines, the host's share
  echo "-- $1"
  shift
  local before after
  before=$(step_sums)
  timeout 120 "$bundle/bin/specula-bench" serve --server 127.0.0.1:$port --server-pid $pid \
    --warmup 1 "$@" 2>&1 | grep -E "TPOT|ITL|Output token|Server CPU|ailed|rror"
  after=$(step_sums)
  awk -v b="$before" -v a="$after" 'BEGIN { split(b, x, " "); split(a, y, " ");
    d = y[1] - x[1]; w = y[2] - x[2]; n = y[3] - x[3];
    if (n > 0 && d > 0) printf "Steps: %d, mean %.3f ms, host work %.0f%% of step time\n",
      n, 1e3 * d / n, 100 * (d - w) / d }'
}
{
  echo "== batch 1, time per output token by context"
  for n in 1024 8192 32768; do
    serve "prompt $n" --input-len $n --output-len 128 --num-prompts 2 --concurrency 1
  done
  echo "== steady decode, 1K prompts"
  for c in 1 8 32 64; do
    serve "concurrency $c" --input-len 1024 --output-len 256 --num-prompts $((c * 2)) \
      --concurrency $c
  done
} 2>&1 | tee "$report/decode.md"
kill -TERM $pid
wait $pid
# A step that could not be recorded runs as issued: slower, and a figure of graphs off.
echo "cuda_graph_not_recorded warnings: $(grep -c cuda_graph_not_recorded "$report/server.log")" |
  tee -a "$report/decode.md"
