"""``prfaas validate FILE...``: check manifests against the CRDs (schema + CEL) and the typed models, and
across files (duplicates, references). ``-`` reads standard input; directories are searched for .yaml/.yml.

Each file can be checked alone (a GitOps pipeline checking one manifest at a time): a reference to an object
that is not among the given files is reported as unresolved and does not fail the check; with
``--strict-references`` (a whole-tree check) it is an error. YAML that is not a Kubernetes manifest (no kind:
a Helm values file) is skipped, saying so; other API groups' objects are skipped too (a pipeline may pass every
YAML file of a repository). An input with no YAML document at all is an error. Given several regions' files at
once, the fleet graph is checked too (one link per PD cluster and site, a site's scheduled links against their
InterDCLinks, site caps; docs/fleet-api.md); a site cap that can never bind is a warning. Exit 0 when every object is
valid, 1 otherwise, 2 on a usage error.
"""

from __future__ import annotations

import argparse
from typing import Any

from prfaas_core.schema.check import Issue
from prfaas_core.schema.validation import Checked, validate_documents
from prfaas_local.manifests import InputError, add_manifest_args, load_documents

from .output import EXIT_ERROR, EXIT_OK, add_output_arg, emit, error


def register(sub: Any) -> None:
    p = sub.add_parser(
        "validate",
        help="validate PrFaaS manifests (CRD schema + CEL rules + typed models + cross-object references)",
        description=__doc__,
    )
    add_manifest_args(p)
    p.add_argument(
        "--strict-references",
        action="store_true",
        help="a reference to an object not among the given files is an error (check a whole tree at once)",
    )
    add_output_arg(p, human="text")
    p.set_defaults(handler=run)


def _issues(issues: list[Issue]) -> list[dict[str, str]]:
    return [{"path": i.path, "message": i.message, "source": i.source} for i in issues]


def report_json(checked: list[Checked]) -> dict[str, Any]:
    return {
        "valid": all(c.ok for c in checked),
        "objects": [
            {
                "file": c.document.source,
                "document": c.document.index,
                "kind": c.document.kind,
                "name": c.document.name,
                "valid": c.ok,
                "skipped": c.skipped,
                "issues": _issues(c.issues),
                "warnings": _issues(c.warnings),
                "unresolved": _issues(c.unresolved),
            }
            for c in checked
        ],
    }


def print_text(checked: list[Checked]) -> None:
    for c in checked:
        if c.skipped:
            print(f"skip  {c.document.label}: {c.skipped}")
        elif c.ok:
            print(f"ok    {c.document.label}")
        else:
            print(f"FAIL  {c.document.label}")
            for issue in c.issues:
                print(f"        {issue}")
        for ref in c.unresolved:
            print(f"        unresolved: {ref.path}: {ref.message}")
        for warning in c.warnings:
            print(f"warn  {c.document.label}: {warning}")
    bad = sum(1 for c in checked if not c.ok)
    total = sum(1 for c in checked if c.skipped is None)
    refs = sum(len(c.unresolved) for c in checked)
    summary = f"{total - bad} of {total} objects valid" + (f"; {bad} invalid" if bad else "")
    if refs:
        summary += f"; {refs} reference(s) unresolved (not in the given files; --strict-references makes them errors)"
    print(summary)


def run(args: argparse.Namespace) -> int:
    try:
        docs = load_documents(args.files)
    except InputError as exc:
        return error(str(exc))
    checked = validate_documents(docs, default_namespace=args.namespace, strict_references=args.strict_references)
    if args.output == "text":
        print_text(checked)
    else:
        emit(report_json(checked), args.output)
    return EXIT_OK if all(c.ok for c in checked) else EXIT_ERROR
