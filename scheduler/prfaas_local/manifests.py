"""Reading manifest files: YAML (multi-document) from files or directories, with errors a person can act on."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from prfaas_core.api import ModelProfile, PDCluster, PrefillCluster
from prfaas_core.launch.render import Cluster
from prfaas_core.schema.validation import Document, validate_documents


class InputError(Exception):
    """Bad input on the command line: a missing file, unreadable YAML. Exit code 2."""


def add_manifest_args(p: Any) -> None:
    """The arguments of a command that reads manifests: FILE... and ``--namespace``."""
    p.add_argument("files", nargs="+", metavar="FILE", help="manifest files or directories (YAML)")
    p.add_argument("--namespace", default="default", help="namespace of objects that name none")


def expand_paths(paths: Sequence[str]) -> list[Path]:
    """Files as given; directories expanded to their *.yaml / *.yml files (sorted, recursive)."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(x for x in p.rglob("*") if x.suffix in (".yaml", ".yml") and x.is_file())
            if not found:
                raise InputError(f"{raw}: directory holds no .yaml or .yml files")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise InputError(f"{raw}: no such file or directory")
    return out


def load_documents(paths: Sequence[str]) -> list[Document]:
    """Every non-empty YAML document in the given files, in order."""
    docs: list[Document] = []
    for path in expand_paths(paths):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: cannot read: {exc}") from exc
        try:
            bodies = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc)
            raise InputError(f"{path}{where}: invalid YAML: {problem}") from exc
        docs += [Document(str(path), i, body) for i, body in enumerate(bodies) if body is not None]
    return docs


def load_clusters(files: Sequence[str], namespace: str = "default") -> tuple[list[Cluster], dict[str, ModelProfile]]:
    """The PrefillClusters and PDClusters in ``files`` and the ModelProfiles by name (validated first)."""
    docs = load_documents(files)
    checked = validate_documents(docs, default_namespace=namespace)
    bad = [f"{c.document.label}: {issue}" for c in checked for issue in c.issues]
    if bad:
        raise InputError("invalid manifests (see `prfaas validate`):\n  " + "\n  ".join(bad))
    models = [c.model for c in checked if c.model is not None]
    profiles = {m.metadata.name: m for m in models if isinstance(m, ModelProfile)}
    clusters: list[Cluster] = [m for m in models if isinstance(m, PrefillCluster | PDCluster)]
    if not clusters:
        raise InputError("no PrefillCluster or PDCluster in the given files")
    return clusters, profiles
