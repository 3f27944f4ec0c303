#!/usr/bin/env bash
# Prints, one per line, the Debian/Ubuntu packages that hold the shared libraries the given
# binaries load (ldd), except the C library, which every base image has, and the CUDA libraries
# under /usr/local/cuda, which the CUDA runtime base image has. The container image's
# runtime stage installs exactly these (deploy/docker/Dockerfile). Fails if a library is not
# found, or belongs to no package (a library copied in by hand would silently be missing at run
# time otherwise).
set -euo pipefail
if [[ $# -eq 0 ]]; then
  echo "usage: $0 BINARY..." >&2
  exit 2
fi
libs=$(ldd "$@" | awk '/=> not found/ { print "MISSING " $1; next } /=> \// { print $3 }' | sort -u)
if grep -q '^MISSING' <<<"$libs"; then
  echo "runtime-packages: unresolved libraries: $(grep '^MISSING' <<<"$libs" | cut -d' ' -f2 | tr '\n' ' ')" >&2
  exit 1
fi
# dpkg knows a library by the path it installed (/lib/... on merged-/usr systems too).
packages=()
while read -r lib; do
  [[ -z $lib ]] && continue
  if [[ $lib == /usr/local/cuda* ]]; then
    echo "runtime-packages: $lib comes with the CUDA runtime base image" >&2
    continue
  fi
  owner=$(dpkg -S "$lib" 2>/dev/null || dpkg -S "$(readlink -f "$lib")" 2>/dev/null ||
          dpkg -S "${lib#/usr}" 2>/dev/null || true)
  if [[ -z $owner ]]; then
    echo "runtime-packages: $lib belongs to no package" >&2
    exit 1
  fi
  packages+=("${owner%%:*}")
done <<<"$libs"
printf '%s\n' "${packages[@]}" | grep -vxE 'libc6|libc6-dev' | sort -u
