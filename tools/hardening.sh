#!/usr/bin/env bash
# The hardening stages of the test run (issue 15, docs/HARDENING.md), after the main suite:
#  1. AddressSanitizer + UndefinedBehaviorSanitizer (preset `asan`) over the whole suite but the
#     deployment tests (label `deploy`: images, manifests, Prometheus) and the load test, which
#     measures resident memory (ASan's quarantine holds freed memory on purpose): every C++ test,
#     and the Python and Node tests against the instrumented server.
#  2. ThreadSanitizer (preset `tsan`) over the engine, KV and server suites that do not go
#     through gRPC: Debian's gRPC and Abseil are not instrumented, so TSan cannot see their
#     synchronization and reports races inside them that are not races.
#  3. The libFuzzer targets (preset `fuzz`, clang), each from its seed corpus for
#     SPECULA_FUZZ_SECONDS (default 20).
# tools/test.sh calls this unless SPECULA_QUICK=1 or ctest arguments were given.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

cmake --preset asan >/dev/null
cmake --build --preset asan -j "$jobs"
ctest --preset asan -j "$jobs" -LE deploy -E '^(LoadE2eTest\..*|fetch_kubernetes_models)$' \
  --timeout 900
echo "hardening: asan+ubsan: the suite is clean"

tsan_targets=(serve_test generate_test sparse_generation_test prefix_cache_test
              page_prefetcher_test prefetch_stress_test host_kv_store_test sparse_cache_test
              server_support_test client_limiter_test send_executor_test chat_test)
cmake --preset tsan >/dev/null
cmake --build --preset tsan -j "$jobs" --target "${tsan_targets[@]}" specula_test_models
# setarch -R: TSan's fixed memory layout fails on kernels with high mmap ASLR.
launch=()
if command -v setarch >/dev/null; then launch=(setarch "$(uname -m)" -R); fi
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
for t in "${tsan_targets[@]}"; do
  bin=$(find build-tsan/tests -type f -name "$t" -perm -u+x | head -n 1)
  [[ -n $bin ]] || { echo "hardening: $t was not built" >&2; exit 1; }
  log=build-tsan/$t.log
  if (cd "$(dirname "$bin")" && "${launch[@]}" "./$t" --gtest_brief=1) >"$log" 2>&1; then
    echo "hardening: tsan $t: $(grep -E '^\[  PASSED' "$log")"
  else
    echo "hardening: tsan $t FAILED; the end of $log:" >&2
    tail -n 200 "$log" >&2
    exit 1
  fi
done

cmake --preset fuzz -DSPECULA_FUZZ_SECONDS="${SPECULA_FUZZ_SECONDS:-20}" >/dev/null
cmake --build --preset fuzz -j "$jobs" --target specula_fuzzers
ctest --preset fuzz -j "$jobs"
echo "hardening: sanitizers and fuzzers clean"
