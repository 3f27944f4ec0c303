#!/usr/bin/env bash
# specula-bench serve --session-suffix-len against the real server on the embedded model: the
# measured second turns must find their sessions' KV (4 sessions x 64 first-turn tokens reused,
# 8 new each), and a different seed's prompts none of it. The prefix cache is off, so only a
# session keeps KV between requests: the reuse proves the bench sent its session ids.
# Usage: serve_sessions_smoke.sh BUILD_DIR
set -uo pipefail
build=$1
ready=$(mktemp -u /tmp/specula-bench-ready.XXXXXX)
cat >"$ready.yaml" <<YAML
server: {listen: "127.0.0.1:0", metrics_listen: "127.0.0.1:0"}
kv_cache: {prefix_cache: false}
YAML
"$build/server/specula-server" --config "$ready.yaml" --ready-file "$ready" 2>"$ready.log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid; rm -f "$ready" "$ready.log" "$ready.yaml"' EXIT
for _ in $(seq 1 600); do
  [[ -s $ready ]] && break
  kill -0 $pid 2>/dev/null || { cat "$ready.log"; echo "server failed to start"; exit 1; }
  sleep 0.1
done
listen=$(sed -n 's/.*"listen": "\([^"]*\)".*/\1/p' "$ready")
fail() { echo "serve_sessions_smoke: $1"; exit 1; }
bench() { "$build/tools/specula-bench" serve --server "$listen" --num-prompts 4 --input-len 64 \
  --output-len 4 --concurrency 4 "$@" 2>&1; }

out=$(bench --session-suffix-len 8 --seed 11)
echo "$out"
grep -Eq '^sessions: 4 first turns \(max_tokens 1: 4 tokens\)' <<<"$out" || fail "no first turns of one token"
grep -Eq '^Successful requests: +4$' <<<"$out" || fail "not every second turn succeeded"
grep -Eq '^Total input tokens: +288 \(256 reused' <<<"$out" || fail "the sessions' KV was not reused"
# Other prompts (another seed, no sessions): nothing of theirs is cached.
out=$(bench --seed 12)
grep -Eq '^Total input tokens: +256 \(0 reused' <<<"$out" || fail "unrelated prompts reported reuse: $out"
out=$(bench --session-suffix-len 8 --compare-engine)
grep -q 'cannot replay --session-suffix-len' <<<"$out" || fail "--compare-engine was not refused: $out"
echo "serve_sessions_smoke: passed"
