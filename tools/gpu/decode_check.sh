#!/usr/bin/env bash
# Runs on the GPU machine: the short check after a change to the decode kernels (issue 35), in
# one device call of about two minutes: tools/gpu/decode_check.sh BUNDLE_DIR REPORT_DIR
#   - the CUDA kernel tests but the prefill tile kernel's (check.sh runs those) and the
#     generation tests, against the CPU backend;
#   - compute-sanitizer memcheck on the decode attention and normalization tests, and on the
#     CUDA-graph replay test;
#   - specula-bench attention's decode tables (attention, then the GEMMs of 1 and 8 rows, and the
#     1B GEMMs again with model.dependent_launches off), then tools/gpu/decode_bench.sh.
source "$(dirname "$0")/begin.sh" "$1" "$2"
step kernels timeout 150 "$bundle/bin/cuda_backend_test" --gtest_filter='-*TileKernel*'
step generate timeout 60 "$bundle/bin/cuda_generate_test"
step memcheck timeout 90 compute-sanitizer --tool memcheck --error-exitcode 1 \
  "$bundle/bin/cuda_backend_test" \
  --gtest_filter='*CudaKvTest*BF16_d64_g4*:*CudaKvTest*F32_d96_g12*:*RmsNorm*:*FusedNorms*:*DecodeGemmsRead*:*GemmMatches*'
step memcheck_graphs timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 \
  "$bundle/bin/cuda_generate_test" --gtest_filter='*ReplayedDecodeSteps*'
timeout 120 "$bundle/bin/specula-bench" attention --device cuda --prefill=false 2>&1 |
  tee "$report/attention.md"
# The 1B GEMM rows again with every kernel launched after the one ahead ends: the dependent
# launches' effect, measured in the same call.
timeout 60 "$bundle/bin/specula-bench" attention --device cuda --prefill=false --decode-shapes='' \
  --gemm-models 1b --dependent-launches=false 2>&1 | tee "$report/attention-ordinary-launches.md"
timeout 120 "$here/decode_bench.sh" "$report/decode"
