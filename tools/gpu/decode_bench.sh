#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/check.sh unpacked the bundle in /tmp/specula-gpu:
#   tools/gpu/decode_bench.sh REPORT_DIR
# Decode figures of issue 35 for a random-weight Llama-3.2-1B-shaped bf16 checkpoint, with the
# card's copy bandwidth measured in the same call (the floor is weight + KV bytes over it):
#   - batch-1 time per output token after 1K, 8K and 32K prompt tokens;
#   - steady output tok/s at concurrency 1, 8, 32, 64 with 1K prompts;
# all through gRPC (`specula-bench serve --server-pid`, which also reports the server's CPU).
set -uo pipefail
report=$1
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
cat >"$report/server.yaml" <<YAML
model: {path: $model, device: cuda}
server: {listen: "127.0.0.1:$port", metrics_listen: ""}
kv_cache: {capacity_tokens: 98304}
scheduler: {max_running_requests: 64}
YAML
"$bundle/bin/specula-server" --config "$report/server.yaml" >"$report/server.log" 2>&1 &
pid=$!
wait_healthy $pid $port || { echo "server not serving"; tail -5 "$report/server.log"; exit 1; }

serve() {  # serve LABEL ARGS...: one specula-bench serve run, its key lines
  echo "-- $1"
  shift
  timeout 120 "$bundle/bin/specula-bench" serve --server 127.0.0.1:$port --server-pid $pid \
    --warmup 1 "$@" 2>&1 | grep -E "TPOT|ITL|Output token|Server CPU|ailed|rror"
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
