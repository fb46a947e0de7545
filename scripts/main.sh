#!/usr/bin/env bash
# The main job on the embedded default, no cluster needed: set up, then plan the paper's case study
# (4 H200 PrFaaS instances, 8 H20 PD instances, 100 Gbps link) — which threshold, which split, how much link —
# against the two baselines, and write the Fig. 5 plots to out/plan/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/prfaas plan --plot-dir out/plan "$@"
