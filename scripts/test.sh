#!/usr/bin/env bash
# Set up, then run every check: lint, format, types, import layering, generated CRDs, and the test suite.
# Usage: scripts/test.sh [--full] [pytest args...]   (--full adds the heavier suites marked `slow`)
set -euo pipefail
cd "$(dirname "$0")/.."
full=0
if [ "${1:-}" = "--full" ]; then full=1; shift; fi
scripts/setup.sh
scripts/system-deps.sh
scripts/helm-tools.sh >/dev/null   # a real helm binary for tests/integration/test_helm.py
# the real-engine tier's vLLM environment and tiny model, outside the clone (cached; ~1.5 min the first time)
if [ "${PRFAAS_SKIP_REAL:-0}" != 1 ]; then
  if ! scripts/real-engines.sh >/dev/null; then
    echo "test: real-engine setup failed; the real-engine tier will skip (or fail under PRFAAS_REQUIRE_REAL=1)" >&2
  fi
fi
export PATH="$PWD/.venv/bin:$PATH"

step() { printf '\n== %s\n' "$*"; }
step "ruff (lint)";            ruff check scheduler operator tests
step "ruff (format)";          ruff format --check scheduler operator tests
step "mypy (strict on the core)"; mypy scheduler/prfaas_core scheduler/prfaas_cli
step "import layering";        lint-imports
step "generated CRDs";         prfaas crds --check --out crds
step "pytest"
# two workers (pytest-xdist; CI has 2 cores): each module is one unit of work, and the real-engine tier one unit on
# one worker, handed out first (tests/conftest.py). PRFAAS_TEST_WORKERS=0 runs everything in this process.
workers=(-n "${PRFAAS_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder)
if [ "$full" = 1 ]; then
  PRFAAS_FULL=1 pytest "${workers[@]}" --durations=25 "$@"
else
  pytest -m "not slow" "${workers[@]}" --durations=25 "$@"
fi
