#!/usr/bin/env bash
# Issue 38's GPU figure: output tok/s of a full batch with and without JSON-schema constraints
# with the forward pass on the device (the masks are built on the host while it runs, and applied
# by the device's MaskLogits before sampling there). Runs after tools/gpu/check.sh (or unpack.sh)
# unpacked the bundle in /tmp/specula-gpu:
#   tools/gpu/constrained_bench.sh REPORT_DIR
# Model: random weights in the Qwen3-0.6B shape (28 layers, hidden 1024, 16 heads, 8 KV heads,
# head_dim 128, vocabulary 151,936) over the real Qwen3 tokenizer the bundle carries; the 50 agent
# schemas of tests/engine/grammar/agent_schemas.json; batch 32, greedy and temperature 1, three
# free/constrained pairs each after a warm-up pair. About 2 minutes.
set -uo pipefail
report=$1
mkdir -p "$report"
bundle=${bundle:-/tmp/specula-gpu}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
source "$here/env.sh"

model=/tmp/specula-qwen3-0.6b
device=${DEVICE:-cuda}  # cpu: a dry run of the script on a machine without a GPU
if [[ ! -e $model/model.safetensors ]]; then
  "$bundle/bin/make-tiny-model" --out "$model" --arch qwen3 --tokenizer-dir "$bundle/tokenizers/qwen3" \
    --dtype bf16 --preset 100m --layers 28 --hidden 1024 --heads 16 --kv_heads 8 --head_dim 128 \
    --intermediate 3072 --vocab 151936 --max_position_embeddings 40960 >"$report/model.log" 2>&1 ||
    { echo "make-tiny-model failed"; cat "$report/model.log"; exit 1; }
fi
for temperature in 0 1; do
  echo "== temperature $temperature"
  timeout 300 "$bundle/bin/specula-bench" constrained --device "$device" --model "$model" \
    --schemas "$repo/tests/engine/grammar/agent_schemas.json" --batch 32 --steps 100 --pairs 3 \
    --temperature "$temperature" 2>"$report/constrained-$temperature.log" |
    tee "$report/constrained-$temperature.md"
done
