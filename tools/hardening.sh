#!/usr/bin/env bash
# The hardening stages of the test run (issue 15), after the main suite:
#  1. AddressSanitizer + UndefinedBehaviorSanitizer (preset `asan`) on the suites where memory
#     and lifetimes are subtle: the engine (scheduler, KV, prefix cache, fault injection), the
#     generator, the server's support code and the server end to end over loopback.
#  2. The libFuzzer targets (preset `fuzz`, clang), each from its seed corpus for
#     SPECULA_FUZZ_SECONDS (default 20).
# ThreadSanitizer runs in the main suite (prefetch_stress_tsan_test). tools/test.sh calls this
# unless SPECULA_QUICK=1 or ctest arguments were given.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

asan_targets=(serve_test generate_test prefix_cache_test page_prefetcher_test host_kv_store_test
              prefix_tree_test server_support_test client_limiter_test bearer_tokens_test
              server_e2e_test)
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$jobs" --target "${asan_targets[@]}" specula_test_models specula-server
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for t in "${asan_targets[@]}"; do
  bin=$(find build-asan/tests -type f -name "$t" -perm -u+x | head -n 1)
  [[ -n $bin ]] || { echo "hardening: $t was not built" >&2; exit 1; }
  log=build-asan/$t.log
  if (cd "$(dirname "$bin")" && "./$t" --gtest_brief=1) >"$log" 2>&1; then
    echo "hardening: asan+ubsan $t: $(grep -E '^\[  PASSED' "$log")"
  else
    echo "hardening: asan+ubsan $t FAILED; the end of $log:" >&2
    tail -n 200 "$log" >&2
    exit 1
  fi
done

cmake --preset fuzz -DSPECULA_FUZZ_SECONDS="${SPECULA_FUZZ_SECONDS:-20}" >/dev/null
cmake --build --preset fuzz -j "$jobs" --target \
  fuzz_config_yaml fuzz_model_config fuzz_safetensors fuzz_tokenizer_json fuzz_chat_template \
  fuzz_generate_request fuzz_openai_request
ctest --preset fuzz -j "$jobs"
echo "hardening: sanitizers and fuzzers clean"
