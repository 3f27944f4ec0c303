#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/check.sh unpacked the bundle in /tmp/specula-gpu:
#   tools/gpu/prefill_bench.sh REPORT_DIR [CONTEXTS]   (CONTEXTS default 1024,8192,32768)
# The prefill figures of issue 36, each with its reference measured in the same call:
# 1. the card: copy bandwidth, bf16 GEMM TFLOP/s, PyTorch's flash SDPA TFLOP/s at the same shapes
#    (tools/gpu/attention_reference.py);
# 2. specula's attention kernels alone (`specula-bench attention --device cuda`);
# 3. time to first token for a random-weight Llama-3.2-1B-shaped model (make-tiny-model): specula
#    over gRPC (`specula-bench serve`, 1 output token) at each prefill chunk size (alone and
#    beside decode rows alike), and
#    transformers' forward pass on the same checkpoint.
set -uo pipefail
report=$1
contexts=${2:-1024,8192,32768}
mkdir -p "$report"
bundle=/tmp/specula-gpu
here=$(cd "$(dirname "$0")" && pwd)
source "$here/env.sh"
export PYTHONUNBUFFERED=1

model=/tmp/specula-1b
make_1b_model "$model" "$report/model.log" || exit 1

echo "== reference (PyTorch, transformers)"
timeout 240 python3 "$here/attention_reference.py" "$model" "$contexts" 2>&1 |
  tee "$report/reference.md"

echo "== specula attention kernels"
timeout 120 "$bundle/bin/specula-bench" attention --device cuda --contexts "$contexts" 2>&1 |
  tee "$report/attention.md"

ttft() {  # ttft CHUNK: specula's TTFT at each context with prefill chunks of CHUNK tokens
  local chunk=$1 port=50161
  cat >"$report/server-$chunk.yaml" <<YAML
model: {path: $model, device: cuda}
server: {listen: "127.0.0.1:$port", metrics_listen: ""}
scheduler: {prefill_chunk_tokens: $chunk, solo_prefill_chunk_tokens: $chunk}
kv_cache: {capacity_tokens: 40960}
YAML
  "$bundle/bin/specula-server" --config "$report/server-$chunk.yaml" >"$report/server-$chunk.log" 2>&1 &
  local pid=$!
  wait_healthy $pid $port ||
    { echo "server not serving"; tail -5 "$report/server-$chunk.log"; kill $pid; return 1; }
  for n in ${contexts//,/ }; do
    echo "-- chunk $chunk, prompt $n"
    timeout 120 "$bundle/bin/specula-bench" serve --server 127.0.0.1:$port --input-len "$n" \
      --output-len 1 --num-prompts 3 --concurrency 1 --warmup 1 2>&1 | grep -E "TTFT|ailed|rror"
  done
  kill -TERM $pid
  wait $pid
}
echo "== specula TTFT (1B shape, bf16 KV)"
for chunk in 512 4096; do ttft $chunk 2>&1 | tee -a "$report/ttft.md"; done
