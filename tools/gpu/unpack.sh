#!/usr/bin/env bash
# Unpacks the bundle made by tools/gpu/bundle.sh into /tmp/specula-gpu on the GPU machine, for the
# scripts that run after it (check.sh does this itself):  tools/gpu/unpack.sh BUNDLE_DIR
set -euo pipefail
rm -rf /tmp/specula-gpu && mkdir -p /tmp/specula-gpu
tar -C /tmp/specula-gpu -xJf "$1/specula-gpu.tar.xz"
