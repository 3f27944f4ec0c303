#!/usr/bin/env bash
# The README's first command, tools/demo.sh, on free ports with the binaries of the build under
# test ($1): it must exit 0 after showing the server answer (health, info, a streamed generation,
# metrics) and drain on SIGTERM.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$(SPECULA_LISTEN=127.0.0.1:0 SPECULA_METRICS_LISTEN=127.0.0.1:0 SPECULA_DEMO_BUILD_DIR=$1 \
      "$repo/tools/demo.sh" 2>&1)
rc=$?
echo "$out"
fail() { echo "demo_e2e: $1" >&2; exit 1; }
((rc == 0)) || fail "tools/demo.sh exited with $rc"
for expected in '^SERVING$' '^max_context_tokens: +4096$' '^specula_generation_tokens_total\{model="[^"]+"\} [1-9][0-9]*$' \
    'event=request_finished' 'event=stopped'; do
  grep -Eq "$expected" <<<"$out" || fail "no line matching '$expected' in the demo's output"
done
echo "demo_e2e: 1 passed, 0 failed"
