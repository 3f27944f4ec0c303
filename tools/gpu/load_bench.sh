#!/usr/bin/env bash
# Runs on the GPU machine after tools/gpu/check.sh unpacked the bundle in /tmp/specula-gpu:
#   tools/gpu/load_bench.sh REPORT_DIR
# Model load time (issue 31): random-weight bf16 checkpoints of the Llama-3.2-1B shape (2.5 GB, one
# file, make-tiny-model) and of the Llama-3.1-8B shape (16 GB, four shards, make_8b_checkpoint.py).
# Each is read once to bring it into the page cache, then timed with `cat > /dev/null` (the floor
# from the page cache), then served by `specula-server --device cuda` twice; the server's
# `model_loaded` line gives the weights' time apart from CUDA init and the KV pool.
set -uo pipefail
report=$1
mkdir -p "$report"
bundle=/tmp/specula-gpu
here=$(cd "$(dirname "$0")" && pwd)
source "$here/env.sh"

small=/tmp/specula-1b
make_1b_model "$small" "$report/model-1b.log" || exit 1
big=/tmp/specula-8b
timeout 240 python3 "$here/make_8b_checkpoint.py" "$small" "$big" 2>&1 | tee "$report/model-8b.log"

load() {  # load NAME DIR: page-cache floor, then the server's model_loaded line, twice
  local name=$1 dir=$2 port=50171
  cat "$dir"/*.safetensors >/dev/null
  local start=$EPOCHREALTIME
  cat "$dir"/*.safetensors >/dev/null
  local end=$EPOCHREALTIME
  echo "$name: $(du -cb "$dir"/*.safetensors | tail -1 | cut -f1) bytes;" \
    "cat from the page cache: $(awk "BEGIN {print $end - $start}") s"
  for run in 1 2; do
    "$bundle/bin/specula-server" --model "$dir" --device cuda --listen "127.0.0.1:$port" \
      --metrics-listen "" >"$report/server-$name-$run.log" 2>&1 &
    local pid=$!
    wait_healthy $pid $port || { echo "server not serving"; tail -5 "$report/server-$name-$run.log"; }
    grep -o 'event=model_loaded.*' "$report/server-$name-$run.log"
    kill -TERM $pid 2>/dev/null; wait $pid
  done
}
{ load 1b "$small"; load 8b "$big"; } 2>&1 | tee "$report/load.md"
