"""Copy the generated files the charts ship into the charts, byte for byte (Helm reads only files inside a
chart): crds/*.yaml into helm/prfaas-crds/files/, the Grafana dashboard into helm/prfaas/files/, the alert rules
(alerts/prfaas-rules.yaml and the chart's Helm template of them, helm/prfaas/files/prfaas-rules.yaml, both rendered by
scripts/build_alerts.py from one rule list), and the engine-args file (``prfaas engines -o helm-values`` of the examples) into
helm/prfaas/files/engines.json. ``--check`` changes nothing and exits 1 when a copy is missing, stale or extra (CI).

Usage: python scripts/sync_chart_files.py [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


ENGINES_FILE = REPO / "helm/prfaas/files/engines.json"
ENGINES_SOURCES = ("examples/01-two-region", "examples/04-real-engines")
"""The chart's engine-args file is `prfaas engines -o helm-values` of these (the one engine-flag function)."""


def engines_json() -> bytes:
    """What `prfaas engines EXAMPLES -o helm-values` prints (rendered here, through the same code)."""
    sys.path.insert(0, str(REPO / "scheduler"))
    from prfaas_cli.engines_cmd import helm_values

    return (json.dumps(helm_values([str(REPO / p) for p in ENGINES_SOURCES]), indent=2, sort_keys=True) + "\n").encode()


def pairs() -> list[tuple[Path, Path]]:
    """(source, copy) for every file a chart ships from elsewhere in the repository."""
    out = [(src, REPO / "helm/prfaas-crds/files" / src.name) for src in sorted((REPO / "crds").glob("*.yaml"))]
    out.append((REPO / "dashboards/prfaas.json", REPO / "helm/prfaas/files/prfaas-dashboard.json"))
    return out


def _alerts() -> object:
    sys.path.insert(0, str(REPO / "scripts"))
    import build_alerts

    return build_alerts


def problems() -> list[str]:
    found = [f"stale: {p.relative_to(REPO)} (run: python scripts/build_alerts.py)" for p in _alerts().stale()]
    expected = set()
    for src, dst in pairs():
        expected.add(dst)
        if not dst.exists():
            found.append(f"missing: {dst.relative_to(REPO)} (copy of {src.relative_to(REPO)})")
        elif dst.read_bytes() != src.read_bytes():
            found.append(f"stale: {dst.relative_to(REPO)} differs from {src.relative_to(REPO)}")
    for extra in sorted((REPO / "helm/prfaas-crds/files").glob("*.yaml")):
        if extra not in expected:
            found.append(f"extra: {extra.relative_to(REPO)} has no source in crds/")
    if not ENGINES_FILE.exists() or ENGINES_FILE.read_bytes() != engines_json():
        found.append(
            f"stale: {ENGINES_FILE.relative_to(REPO)} differs from "
            f"prfaas engines {' '.join(ENGINES_SOURCES)} -o helm-values"
        )
    return found


def sync() -> int:
    changed = _alerts().write()
    expected = set()
    for src, dst in pairs():
        expected.add(dst)
        if not dst.exists() or dst.read_bytes() != src.read_bytes():
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(src.read_bytes())
            changed += 1
    for extra in (REPO / "helm/prfaas-crds/files").glob("*.yaml"):
        if extra not in expected:
            extra.unlink()
            changed += 1
    engines = engines_json()
    if not ENGINES_FILE.exists() or ENGINES_FILE.read_bytes() != engines:
        ENGINES_FILE.write_bytes(engines)
        changed += 1
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report differences (exit 1 if any)")
    args = parser.parse_args(argv)
    if args.check:
        found = problems()
        for line in found:
            print(line, file=sys.stderr)
        if found:
            print("run: python scripts/sync_chart_files.py", file=sys.stderr)
        return 1 if found else 0
    print(f"{sync()} file(s) updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
