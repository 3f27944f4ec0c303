#!/usr/bin/env bash
# Runs on the GPU machine after the bundle is unpacked in /tmp/specula-gpu:
#   tools/gpu/decode_profile.sh REPORT_DIR
# Where a batch-1 decode step's time goes (issue 35): Nsight Compute times every kernel of a few
# decode steps of the Llama-3.2-1B-shaped model served by specula-server, and the summary gives
# the GPU time per step by kernel, to set against the time per output token that
# decode_bench.sh measures (the difference is host work and launch gaps).
set -uo pipefail
report=$1
mkdir -p "$report"
bundle=/tmp/specula-gpu
here=$(cd "$(dirname "$0")" && pwd)
source "$here/env.sh"

model=/tmp/specula-1b
make_1b_model "$model" "$report/model.log" || exit 1

port=50191
# Skip the prefill and the first steps; time about four decode steps.
ncu --clock-control none --target-processes all --metrics gpu__time_duration.sum --csv \
  --launch-skip 4000 --launch-count 1000 --log-file "$report/ncu.csv" \
  "$bundle/bin/specula-server" --model "$model" --device cuda --listen "127.0.0.1:$port" \
  --metrics-listen "" >"$report/server.log" 2>&1 &
pid=$!
wait_healthy $pid $port || { echo "server not serving"; tail -5 "$report/server.log"; exit 1; }
timeout 200 "$bundle/bin/specula-cli" generate --server "127.0.0.1:$port" \
  --prompt_ids 1,2,3,4,5 --max-tokens 60 | tail -2
# Stop the server (ncu's child), not ncu, which would end without writing its report.
pkill -TERM -x specula-server
wait $pid
python3 - "$report/ncu.csv" <<'PY'
import csv, collections, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, rows = rows[0], rows[1:]
name, value, unit = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
total = collections.defaultdict(float)
count = collections.Counter()
for r in rows:
    k = r[name].replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    k = k.replace("void ", "")
    k = k.split("(")[0].split("<")[0][-60:]
    total[k] += float(r[value].replace(",", "")) * scale[r[unit]]
    count[k] += 1
all_us = sum(total.values())
print(f"{len(rows)} kernels, {all_us:.0f} us of GPU time")
print("| kernel | launches | us | share |\n|---|---|---|---|")
for k, t in sorted(total.items(), key=lambda kv: -kv[1]):
    print(f"| {k} | {count[k]} | {t:.0f} | {100 * t / all_us:.1f}% |")
PY
