#!/usr/bin/env bash
# Idempotent: every file of the locks (requirements/runtime.txt, build.txt) for CPython 3.11 on this platform, in a
# folder outside the clone (~/.cache/prfaas/wheelhouse), hash-checked by pip. The image test builds from it
# (PIP_NO_INDEX/PIP_FIND_LINKS build arguments) and the package test installs the wheel from it, so neither
# downloads the closure again (pip's HTTP cache does not help here). Re-downloads only when a lock changed.
# Prints the folder. Safe to call concurrently (flock'd).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${PRFAAS_WHEELHOUSE:-$HOME/.cache/prfaas/wheelhouse}
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9
want=$(cat requirements/runtime.txt requirements/build.txt | sha256sum | cut -c1-16)
if [ "$(cat "$dir/.stamp" 2>/dev/null)" != "$want" ]; then
  echo "wheelhouse: downloading the locked wheels into $dir" >&2
  python3 -m pip download --quiet --disable-pip-version-check --require-hashes --only-binary=:all: \
    --python-version 3.11 --implementation cp -r requirements/runtime.txt -r requirements/build.txt -d "$dir" >&2
  echo "$want" > "$dir/.stamp"
fi
echo "$dir"
