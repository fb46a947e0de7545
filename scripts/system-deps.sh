#!/usr/bin/env bash
# Idempotent: installs the system packages the test suite and benchmarks run for real (Debian): Prometheus,
# which the integration tests start on 127.0.0.1 to scrape the engine and link emulators, and wrk, the load
# generator of benchmarks/router_overhead.py and benchmarks/testbed.py. Runs `apt-get update` once, and only
# when something is missing; a second run does nothing.
set -euo pipefail
missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "system-deps: need root to apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "system-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
