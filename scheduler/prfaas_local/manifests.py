"""Reading manifest files: YAML (multi-document) from files, directories or standard input (``-``), with errors a
person can act on."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from prfaas_core.api import ModelProfile, PDCluster, PrefillCluster
from prfaas_core.launch.render import Cluster
from prfaas_core.schema.validation import Document, validate_documents

from .formats import yaml_error

STDIN = "-"
"""The file name that reads standard input (as kubectl's ``-f -``)."""


class InputError(Exception):
    """Bad input: a missing file, unreadable YAML, no objects at all. Exit code 1."""


def add_manifest_args(p: Any) -> None:
    """The arguments of a command that reads manifests: FILE... and ``--namespace``."""
    p.add_argument("files", nargs="+", metavar="FILE", help="manifest files or directories (YAML); - reads stdin")
    p.add_argument("--namespace", "-n", default="default", help="namespace of objects that name none")


def read_input(raw: str, what: str = "file") -> tuple[str, str]:
    """(source name, text) of a file, or of standard input for ``-``; InputError names the file and why."""
    if raw == STDIN:
        try:
            return "<stdin>", sys.stdin.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"<stdin>: cannot read: {exc}") from None
    try:
        return raw, Path(raw).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{raw}: no such {what}") from None
    except IsADirectoryError:
        raise InputError(f"{raw}: is a directory, not a {what}") from None
    except OSError as exc:
        raise InputError(f"{raw}: cannot read the {what}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InputError(f"{raw}: cannot read the {what}: not UTF-8 text") from None


def expand_paths(paths: Sequence[str]) -> list[Path]:
    """Files as given; directories expanded to their *.yaml / *.yml files (sorted, recursive); ``-`` as is."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if raw == STDIN:
            out.append(p)
        elif p.is_dir():
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
    """Every non-empty YAML document in the given files, in order; InputError when there is none at all."""
    docs: list[Document] = []
    for path in expand_paths(paths):
        source, text = read_input(str(path))
        try:
            bodies = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            raise InputError(yaml_error(source, exc)) from None
        docs += [Document(source, i, body) for i, body in enumerate(bodies) if body is not None]
    if not docs:
        names = ", ".join("<stdin>" if x == STDIN else x for x in paths)
        raise InputError(f"{names}: no YAML documents (an empty input is not a manifest)")
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
