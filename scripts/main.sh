#!/usr/bin/env bash
# The main job on the embedded default, no cluster needed: set up, then `prfaas up` — the two-datacenter system
# on this machine (2 emulated H200 PrFaaS engines behind the gateway, 4 emulated H20 PD engines, the shaped
# link their KV really crosses, the router, the core's long-term loop), replaying the paper's input lengths for
# 240 model seconds with a live view; prints SLO attainment, TTFT by route, egress vs the cap, roles and t, and
# writes out/up/up.png. Extra arguments go to `prfaas up` (e.g. --load 0.7, --link-gbps 10, -o json).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/prfaas up --plot-dir out/up "$@"
