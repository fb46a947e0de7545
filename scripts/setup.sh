#!/usr/bin/env bash
# Idempotent setup: a virtual environment in .venv with the project (editable) and its test extra.
# Re-installs only when pyproject.toml or the set of packages changed. Safe to run any number of times.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
  echo "setup: need Python >= 3.11 (found: $("$PY" --version 2>&1))" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "$PY" -m venv .venv
fi
stamp=.venv/.prfaas-installed
want=$( (cat pyproject.toml; find scheduler operator -maxdepth 2 -name __init__.py | sort) | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing prfaas and its dependencies into .venv" >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
  echo "$want" > "$stamp"
fi
