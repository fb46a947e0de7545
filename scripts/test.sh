#!/usr/bin/env bash
# Set up, then run every check: lint, format, types, import layering, generated CRDs and docs, the docs site (mkdocs
# --strict), and the test suite.
# Usage: scripts/test.sh [--full] [pytest args...]   (--full adds the heavier suites marked `slow`)
set -euo pipefail
cd "$(dirname "$0")/.."
full=0
if [ "${1:-}" = "--full" ]; then full=1; shift; fi
scripts/setup.sh
scripts/system-deps.sh
scripts/helm-tools.sh >/dev/null   # a real helm binary for tests/integration/test_helm.py
# buildah + mmdebstrap and a Debian base image for tests/integration/test_image.py (cached in ~/.cache/prfaas/image);
# exit 3: cannot be installed here (not root), and the image test skips saying so
scripts/image-tools.sh >/dev/null || [ $? = 3 ]
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
step "mypy (strict on the core)"; mypy scheduler/prfaas_core scheduler/prfaas_cli scheduler/prfaas_local
step "import layering";        lint-imports
step "generated CRDs";         prfaas crds --check --out crds
step "generated docs";         python scripts/gen_docs.py --check
step "docs site";              NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet
step "pytest"
# Two workers (pytest-xdist; CI has 2 cores): each module is one unit of work, and the real-engine tier one unit on
# one worker, handed out first (tests/conftest.py). Then the tests marked `solo` (a time-scaled scenario that needs
# the machine to itself), in one process. PRFAAS_TEST_WORKERS=0 runs the first part in this process too.
workers=(-n "${PRFAAS_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder)
marks="not slow"
if [ "$full" = 1 ]; then export PRFAAS_FULL=1; marks="slow or not slow"; fi
collected=0
part() {  # pytest with "$@"; "no tests collected" (5) is fine for one part, not for both
  local rc=0
  pytest "$@" || rc=$?
  if [ "$rc" = 5 ]; then return 0; fi
  [ "$rc" = 0 ] && collected=1
  return "$rc"
}
rm -f out/image-size.txt
part -m "($marks) and not solo" "${workers[@]}" --durations=25 "$@"
if [ -f out/image-size.txt ]; then cat out/image-size.txt; fi   # written by tests/integration/test_image.py
part -m "($marks) and solo" --durations=10 "$@"
if [ "$collected" = 0 ]; then echo "test: no tests collected" >&2; exit 5; fi
