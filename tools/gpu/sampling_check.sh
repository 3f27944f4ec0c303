#!/usr/bin/env bash
# Runs on the GPU machine: the check after a change to the device sampler (issue 35 item 1), in
# one device call of about three minutes: tools/gpu/sampling_check.sh BUNDLE_DIR REPORT_DIR
#   - the CUDA kernel tests (the sampler against the CPU reference among them);
#   - compute-sanitizer memcheck and racecheck on the sampler's small vocabularies;
#   - specula-bench sampling: the device sampler against reading the logits back and sampling
#     on the host, Llama 3's vocabulary, 1 to 128 rows.
source "$(dirname "$0")/begin.sh" "$1" "$2"
small='*CudaSampling*Vocab1:*CudaSampling*Vocab37:*CudaSampling*Vocab4099'
step kernels timeout 150 "$bundle/bin/cuda_backend_test" --gtest_filter='-*TileKernel*'
step memcheck timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 \
  "$bundle/bin/cuda_backend_test" --gtest_filter="$small"
step racecheck timeout 150 compute-sanitizer --tool racecheck --error-exitcode 1 \
  "$bundle/bin/cuda_backend_test" --gtest_filter='*CudaSampling*Vocab1:*CudaSampling*Vocab37'
timeout 120 "$bundle/bin/specula-bench" sampling --device cuda 2>&1 | tee "$report/sampling.md"
