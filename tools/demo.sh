#!/usr/bin/env bash
# Installs, builds, starts specula-server on its embedded default model (a tiny random-weight
# Llama-3-style model the project generates itself; its text is gibberish by design) and shows it
# answering over gRPC: model info, health, a streamed generation, and a few Prometheus metrics.
# Then it stops the server with SIGTERM (a graceful drain). `tools/demo.sh --keep` leaves the
# server running in the foreground instead (Ctrl-C to stop). SPECULA_DEMO_BUILD_DIR=DIR uses the
# binaries already built there and skips installing and building (the demo's own test does).
set -euo pipefail
cd "$(dirname "$0")/.."
keep=false
[[ ${1:-} == --keep ]] && keep=true
if [[ -n ${SPECULA_DEMO_BUILD_DIR:-} ]]; then
  build_dir=$SPECULA_DEMO_BUILD_DIR
else
  tools/install-deps.sh
  preset=${SPECULA_PRESET:-default}
  cmake --preset "$preset" >/dev/null
  # The server, the CLI and the Python client package (build/python, for PYTHONPATH use).
  cmake --build --preset "$preset" -j "$(nproc)" --target specula-server specula-cli \
      specula_python_client
  build_dir=build
  if [[ $preset != default ]]; then build_dir=build-$preset; fi
fi
listen=${SPECULA_LISTEN:-127.0.0.1:50051}
metrics=${SPECULA_METRICS_LISTEN:-127.0.0.1:9400}
ready=$(mktemp -u /tmp/specula-ready.XXXXXX)
log=${ready}.log

# The server's one-line logs go to a file so they do not interleave with the client's output.
"$build_dir/server/specula-server" --listen "$listen" --metrics-listen "$metrics" \
    --ready-file "$ready" 2>"$log" &
server_pid=$!
trap 'kill -TERM $server_pid 2>/dev/null || true; rm -f "$ready"; cat "$log" >&2' EXIT
for _ in $(seq 1 600); do
  [[ -s $ready ]] && break
  kill -0 $server_pid 2>/dev/null || { echo "specula-server failed to start:" >&2; exit 1; }
  sleep 0.1
done
[[ -s $ready ]] || { echo "specula-server did not become ready" >&2; exit 1; }
# The bound addresses (a port of 0 in SPECULA_LISTEN picks a free one).
listen=$(sed -n 's/.*"listen": "\([^"]*\)".*/\1/p' "$ready")
metrics=$(sed -n 's/.*"metrics_listen": "\([^"]*\)".*/\1/p' "$ready")
echo "== specula-server is listening on $listen (metrics on http://$metrics/metrics)"

cli=("$build_dir/tools/specula-cli" --server "$listen")
echo "== specula-cli health"
"${cli[@]}" health
echo "== specula-cli info"
"${cli[@]}" info
echo "== specula-cli generate --prompt 'Hello, specula!' --max_tokens 32 --temperature 0.8 --seed 1"
"${cli[@]}" generate --prompt "Hello, specula!" --max_tokens 32 --temperature 0.8 --seed 1
echo "== a few metrics from http://$metrics/metrics"
if command -v curl >/dev/null; then
  curl -s "http://$metrics/metrics" | grep -E '^specula_(requests_total|generation_tokens_total|time_to_first_token_seconds_count)' || true
fi

if $keep; then
  echo "== serving until Ctrl-C; server log: $log"
  trap - EXIT
  wait $server_pid
else
  echo "== stopping the server (SIGTERM drains in-flight requests, exit code 0)"
  kill -TERM $server_pid
  wait $server_pid
  trap - EXIT
  echo "== the server's log"
  cat "$log"
  rm -f "$ready" "$log"
fi
