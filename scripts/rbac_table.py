"""Regenerate the operator's RBAC table in operator/README.md from a real operator run's request log.

Runs ``prfaas operator`` against the Kubernetes API emulator over HTTP through a reconcile of the two-region
example (``prfaas_testbed.rbac_log.record_operator_calls``), collects the verbs and resources it requested,
and writes the table between the README's ``rbac-table`` markers. ``--check`` only compares (exit 1 on a
difference). tests/integration/test_helm.py checks the same table, the rules file and the rendered chart
against one run in the default test run.

Usage: ``.venv/bin/python scripts/rbac_table.py [--check]`` (about a minute; needs Prometheus, as the operator
integration tests do).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from prfaas_testbed.rbac_log import README, load_rules, rbac_table, readme_table, record_operator_calls, with_table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 when the README differs")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        calls, _ = record_operator_calls(Path(tmp))
    table = rbac_table(calls, load_rules())
    text = README.read_text()
    if args.check:
        if readme_table(text) != table:
            print(f"{README}: the RBAC table differs from the run's; run scripts/rbac_table.py", file=sys.stderr)
            print(table)
            return 1
        return 0
    README.write_text(with_table(text, table))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
