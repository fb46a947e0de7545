#!/usr/bin/env bash
# The main job on the embedded default, no cluster needed: set up, then `prfaas up` — the two-datacenter system
# on this machine (2 emulated H200 PrFaaS engines behind the gateway, 4 emulated H20 PD engines, the shaped
# link their KV really crosses, the router, the core's long-term loop) running the default scenario in phases
# (steady, long prompts, a link squeeze, recovery: examples/05-up/phases.yaml) with a live view; prints a
# summary per phase and writes out/up/up.png and, with Prometheus, out/up/dashboard.png (the Grafana
# dashboard's panels from a local Prometheus's series). Extra arguments go to `prfaas up` (e.g. -o json,
# --scenario FILE, --serve).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if ! command -v prometheus >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1; } \
      || true
  fi
  command -v prometheus >/dev/null 2>&1 \
    || echo "main: Prometheus is not installed and could not be (needs root and Debian's apt); no local Prometheus and no dashboard picture this run" >&2
fi
.venv/bin/prfaas up --work-dir out/up/work --plot-dir out/up "$@"
