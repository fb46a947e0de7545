#!/usr/bin/env bash
# The main job on the embedded default, no cluster needed: set up, then validate the shipped two-region
# manifests (CRD schema + CEL + typed models + cross-object references).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ex=examples/01-two-region
echo "== region A (PrFaaS cluster)"
.venv/bin/prfaas validate "$ex/common" "$ex/region-a"
echo "== region B (PD cluster, remote PrFaaS description, link)"
.venv/bin/prfaas validate "$ex/common" "$ex/region-b"
