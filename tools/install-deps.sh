#!/usr/bin/env bash
# Installs every Debian package specula's build and tests need. Idempotent: packages already
# present are skipped, so CI and developers can call it on every run at little cost.
# The CUDA toolkit is not installed here: it ships with the GPU machines (nvcc on PATH or in
# /usr/local/cuda/bin); without it the build is CPU-only.
# `--build-only`: just what building the server and tools needs (the container image's build
# stage, deploy/docker/Dockerfile), none of the test tools.
set -euo pipefail

build_packages=(
  build-essential cmake ninja-build ccache pkg-config git python3
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libyaml-cpp-dev prometheus-cpp-dev libboost-dev libssl-dev
  libopenblas-dev libopenblas0-pthread libpcre2-dev libicu-dev nlohmann-json3-dev
)
packages=(
  "${build_packages[@]}"
  libgtest-dev libgmock-dev
  prometheus  # for promtool, which lints /metrics in the tests (on a systemd host the package
              # also enables a Prometheus service on :9090; CI containers do not start it)
  python3-numpy python3-grpcio python3-protobuf python3-yaml
  python3-jinja2  # the reference renderer of chat templates in the tests (as transformers sets it up)
  python3-jsonschema  # the independent validator of constrained (structured) outputs in the tests
  json-schema-test-suite  # the official JSON Schema Test Suite: acceptance tests of the compiler
  python3-venv python3-pip python3-setuptools python3-wheel
  curl ca-certificates
  openssl  # makes the certificates of the TLS tests
  clang libclang-rt-dev  # the libFuzzer targets (tools/hardening.sh, preset fuzz)
  # The container image's test (tests/deploy/container): podman with runc, and debootstrap for
  # the Debian base image no registry can give us here.
  podman runc netavark iptables debootstrap
  docker-compose  # validates and renders deploy/compose.yaml (no daemon needed)
)

missing=()
if [[ ${1:-} == --build-only ]]; then
  packages=("${build_packages[@]}")
else
  # npm fetches the real tokenizer fixtures; a machine whose Node.js came from elsewhere already
  # has one, and Debian's npm would conflict with that Node.js.
  command -v npm >/dev/null 2>&1 || packages+=(npm)
fi
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
