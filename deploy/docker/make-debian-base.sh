#!/usr/bin/env bash
# Makes the Debian 12 base image locally, for machines that reach Debian's package archive but no
# image registry: debootstrap a minimal Debian into a folder, then `podman import` it under the
# name the CPU build uses (docker.io/library/debian:bookworm, i.e. `debian:bookworm`).
#   deploy/docker/make-debian-base.sh [WORKDIR]   (root; WORKDIR keeps the rootfs, default a temp)
# Does nothing when the image is already there. Needs debootstrap and podman (Debian packages).
set -euo pipefail
image=${SPECULA_BASE_IMAGE:-docker.io/library/debian:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if podman image exists "$image"; then
  echo "make-debian-base: $image already present"
  exit 0
fi
work=${1:-$(mktemp -d)}
rootfs=$work/rootfs
rm -rf "$rootfs"
echo "make-debian-base: debootstrap bookworm (minbase) from $mirror into $rootfs"
debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -20 "$work/debootstrap.log" >&2
  exit 1
}
# The archive the image's apt uses, as in Debian's official images (main, updates, security).
cat >"$rootfs/etc/apt/sources.list" <<SOURCES
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb ${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security} bookworm-security main
SOURCES
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' - "$image"
rm -rf "$rootfs"
echo "make-debian-base: imported $image"
