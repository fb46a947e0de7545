"""``prfaas validate FILES...``: check manifests against the CRDs (schema + CEL) and the typed models, and
across files (dangling references, duplicates). Exit 0 when all is well, 2 on any error."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from prfaas_core.schema.validation import Checked, validate_documents
from prfaas_local.manifests import InputError, add_manifest_args, load_documents


def register(sub: Any) -> None:
    p = sub.add_parser(
        "validate",
        help="validate PrFaaS manifests (CRD schema + CEL rules + typed models + cross-object references)",
        description=__doc__,
    )
    add_manifest_args(p)
    p.add_argument("--output", "-o", choices=("text", "json"), default="text", help="report format")
    p.set_defaults(handler=run)


def report_json(checked: list[Checked]) -> dict[str, Any]:
    return {
        "valid": all(c.ok for c in checked),
        "objects": [
            {
                "file": c.document.source,
                "document": c.document.index,
                "kind": c.document.kind,
                "name": c.document.name,
                "skipped": c.skipped,
                "issues": [{"path": i.path, "message": i.message, "source": i.source} for i in c.issues],
                "warnings": [{"path": i.path, "message": i.message, "source": i.source} for i in c.warnings],
            }
            for c in checked
        ],
    }


def run(args: argparse.Namespace) -> int:
    try:
        docs = load_documents(args.files)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    checked = validate_documents(docs, default_namespace=args.namespace)
    if args.output == "json":
        print(json.dumps(report_json(checked), indent=2))
    else:
        for c in checked:
            if c.skipped:
                print(f"skip  {c.document.label}: {c.skipped}")
            elif c.ok:
                print(f"ok    {c.document.label}")
            else:
                print(f"FAIL  {c.document.label}")
                for issue in c.issues:
                    print(f"        {issue}")
            for warning in c.warnings:
                print(f"warn  {c.document.label}: {warning}")
        bad = sum(1 for c in checked if not c.ok)
        total = sum(1 for c in checked if c.skipped is None)
        summary = f"{total - bad} of {total} objects valid"
        print(summary if not bad else f"{summary}; {bad} invalid", file=sys.stderr if bad else sys.stdout)
    return 0 if all(c.ok for c in checked) else 2
