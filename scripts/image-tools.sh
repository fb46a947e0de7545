#!/usr/bin/env bash
# Idempotent setup for building the image here (tests/integration/test_image.py), where no Docker engine runs
# and no container registry can be reached: buildah + mmdebstrap from Debian's packages, and a Debian base image
# made by mmdebstrap (python3 + venv + CA certificates), cached outside the clone in ~/.cache/prfaas/image and
# committed into buildah's storage as localhost/prfaas-base:<hash>. Prints that image name on stdout.
# Exit 3: buildah cannot be installed here (not root, or no apt-get): the image test skips and says so.
# Safe to call any number of times and concurrently (flock'd); the second call takes about a second.
set -euo pipefail
cd "$(dirname "$0")/.."

export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
cache=${PRFAAS_IMAGE_CACHE:-$HOME/.cache/prfaas/image}
suite=bookworm
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

if ! command -v buildah >/dev/null 2>&1 || ! command -v mmdebstrap >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "image-tools: buildah/mmdebstrap are missing and cannot be installed here (needs root and Debian's apt)" >&2
    exit 3
  fi
  echo "image-tools: installing buildah and mmdebstrap (apt)" >&2
  apt-get install -y -qq --no-install-recommends buildah mmdebstrap uidmap >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends buildah mmdebstrap uidmap >/dev/null; }
fi

# The base: Debian's python3 (3.11 on bookworm, as the official python:3.11-slim), venv, CA certificates, plus
# this machine's own extra CAs (/usr/local/share/ca-certificates: an egress proxy's, where there is one) so that
# pip inside the build reaches PyPI as pip on the host does. PIP_CERT points pip at the system bundle.
cas=$(find /usr/local/share/ca-certificates -name '*.crt' 2>/dev/null | sort || true)
recipe="mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates,passwd $suite v1"
key=$( (echo "$recipe"; for f in $cas; do sha256sum "$f"; done) | sha256sum | cut -c1-12)
tarball="$cache/base-$suite-$key.tar"
if [ ! -s "$tarball" ]; then
  echo "image-tools: making the Debian base with mmdebstrap (~30 s)" >&2
  hooks=()
  if [ -n "$cas" ]; then
    hooks+=(--customize-hook='mkdir -p "$1/usr/local/share/ca-certificates"')
    for f in $cas; do hooks+=(--customize-hook="copy-in $f /usr/local/share/ca-certificates/"); done
    hooks+=(--customize-hook='chroot "$1" update-ca-certificates >/dev/null')
  fi
  # leaner: no apt lists, docs or man pages in the base
  hooks+=(--customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/usr/share/doc/* "$1"/usr/share/man/*')
  rm -rf "$tarball.tmp"
  mmdebstrap --quiet --format=tar --variant=minbase --include=python3,python3-venv,ca-certificates,passwd \
    "${hooks[@]}" "$suite" "$tarball.tmp"
  mv "$tarball.tmp" "$tarball"
fi

image="localhost/prfaas-base:$key-c1"  # c1: the config below
if ! buildah inspect --type image "$image" >/dev/null 2>&1; then
  echo "image-tools: committing $image into buildah's storage" >&2
  ctr=$(buildah from scratch)
  trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
  buildah add --quiet "$ctr" "$tarball" / >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env PIP_CERT=/etc/ssl/certs/ca-certificates.crt --env LANG=C.UTF-8 --cmd python3 "$ctr"
  buildah commit --quiet --rm "$ctr" "$image" >/dev/null
  trap - EXIT
fi
echo "$image"
