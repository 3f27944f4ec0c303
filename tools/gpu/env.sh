# Sourced by the GPU machine's scripts after a bundle is unpacked in $bundle: finds the CUDA
# toolkit's cuBLAS and runtime (the machine's own, not bundled) and points the loader and the
# tests at the bundle.
for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cu13", "lib") for p in nvidia.__path__))' 2>/dev/null); do
  [[ -e "$dir/libcublas.so.13" ]] && cuda_lib=${cuda_lib:-$dir}
done
export LD_LIBRARY_PATH=$bundle/lib:${cuda_lib:-}:${LD_LIBRARY_PATH:-}
export SPECULA_TEST_MODELS_DIR=$bundle/test_models
