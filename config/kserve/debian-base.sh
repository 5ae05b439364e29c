#!/usr/bin/env bash
# A local base image from Debian's own packages (no registry needed): bookworm minbase with python3 (3.11),
# python3-venv, a JRE 17, tini and passwd (useradd), imported into podman: what config/kserve/Containerfile needs.
# `make kserve-image-test` builds on it (BASE_IMAGE); a real build uses the Containerfile's default (a public slim
# Python 3.11 image) instead.
# Usage: config/kserve/debian-base.sh [IMAGE_NAME] [--no-jre]   (nothing to do if it exists; DEBIAN_MIRROR: another
# mirror). --no-jre: without the JRE, the base of config/kserve/standalone/Containerfile (which holds no Java).
set -euo pipefail
name=${1:-localhost/bucketing-debian-base:bookworm}
jre=openjdk-17-jre-headless,
if [ "${2:-}" = --no-jre ]; then jre=""; fi
if podman image exists "$name"; then
  echo "base image $name exists"
  exit 0
fi
root=$(mktemp -d "${TMPDIR:-/var/tmp}/debian-base.XXXXXX")
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase \
  --include="python3,python3-venv,ca-certificates,${jre}tini,passwd" \
  bookworm "$root" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$root.log" 2>&1 \
  || { tail -20 "$root.log"; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" --numeric-owner -c . | podman import --change 'CMD ["/bin/bash"]' - "$name" >/dev/null
echo "base image $name built"
