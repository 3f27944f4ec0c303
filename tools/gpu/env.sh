# Sourced by the GPU machine's scripts after a bundle is unpacked in $bundle: finds the CUDA
# toolkit's cuBLAS and runtime (the machine's own, not bundled) and points the loader and the
# tests at the bundle.
for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cu13", "lib") for p in nvidia.__path__))' 2>/dev/null); do
  [[ -e "$dir/libcublas.so.13" ]] && cuda_lib=${cuda_lib:-$dir}
done
export LD_LIBRARY_PATH=$bundle/lib:${cuda_lib:-}:${LD_LIBRARY_PATH:-}
export SPECULA_TEST_MODELS_DIR=$bundle/test_models

# step NAME COMMAND...: runs COMMAND with its output in $report/NAME.log, then prints one line:
# its exit status, the seconds since $start, and the log's test and sanitizer summaries.
step() {
  local name=$1
  shift
  "$@" >"$report/$name.log" 2>&1
  echo "$name: rc $? at $((SECONDS - start)) s; $(grep -E '^\[  (PASSED|FAILED)|ERROR SUMMARY|RACECHECK SUMMARY' \
    "$report/$name.log" | tr '\n' ' ')"
}

# wait_healthy PID PORT: waits (up to 60 s) until the server PID answers health on PORT; fails
# at once if it exited (its log says why).
wait_healthy() {
  for _ in $(seq 1 300); do
    kill -0 "$1" 2>/dev/null || return 1
    "$bundle/bin/specula-cli" health --server "127.0.0.1:$2" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  return 1
}

# start_server LABEL PORT [TRIES]: starts the bundle's server on $report/server-LABEL.yaml (its
# log beside it) and waits until it answers health on PORT, TRIES times up to 60 s (pinning a
# large host store takes a while); sets server_pid. When it does not, says why and fails.
start_server() {
  local label=$1 port=$2 tries=${3:-1} i
  "$bundle/bin/specula-server" --config "$report/server-$label.yaml" \
    >"$report/server-$label.log" 2>&1 &
  server_pid=$!
  for ((i = 0; i < tries; ++i)); do wait_healthy $server_pid "$port" && return 0; done
  echo "$label: server not serving"
  tail -5 "$report/server-$label.log"
  kill -TERM $server_pid 2>/dev/null
  wait $server_pid
  return 1
}

# metric_values PORT FAMILY...: "name value" per sample of those families from the server's
# /metrics on PORT. A sample with a `kind` label is named name:kind; other labels are dropped
# (the request families' constant `model`).
metric_values() {
  python3 - "$@" <<'PY'
import sys, urllib.request
port, keep = sys.argv[1], set(sys.argv[2:])
text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
for line in text.splitlines():
    parts = line.rsplit(" ", 1)  # a label value may hold spaces; the value does not
    if line.startswith("#") or len(parts) != 2 or parts[0].split("{")[0] not in keep:
        continue
    name = parts[0].split("{")[0]
    kind = parts[0].split('kind="')[1].split('"')[0] if 'kind="' in parts[0] else ""
    print(f"{name}:{kind}" if kind else name, parts[1])
PY
}

# make_1b_model DIR LOG: a random-weight Llama-3.2-1B-shaped bf16 checkpoint in DIR (kept when
# already there), make-tiny-model's output in LOG.
make_1b_model() {
  [[ -e $1/model.safetensors ]] && return 0
  "$bundle/bin/make-tiny-model" --out "$1" --arch llama --preset 100m --dtype bf16 \
    --layers 16 --hidden 2048 --heads 32 --kv_heads 8 --head_dim 64 --intermediate 8192 \
    --vocab 128256 --max_position_embeddings 131072 >"$2" 2>&1 ||
    { echo "make-tiny-model failed"; cat "$2"; return 1; }
}
