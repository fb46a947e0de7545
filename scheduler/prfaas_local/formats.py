"""The machine-readable output formats of the CLI's commands (``-o json|yaml``) and the wording of an OS error,
in one place (the CLI and the local stack both print them)."""

from __future__ import annotations

import json
from typing import Any

import yaml

STRUCTURED = ("json", "yaml")
"""The machine-readable ``-o`` formats every command that prints objects or reports offers."""


def render(data: Any, fmt: str) -> str:
    """``data`` (plain dicts, lists, scalars) as JSON or YAML text, ending in a newline. YAML goes through JSON,
    so that tuples and other JSON-able values come out as plain YAML, the same document as the JSON form."""
    text = json.dumps(data, indent=2, allow_nan=False)
    if fmt == "yaml":
        return yaml.safe_dump(json.loads(text), sort_keys=False, allow_unicode=True, width=120)
    return text + "\n"


def os_error(what: str, exc: OSError) -> str:
    """``what: reason`` for an OSError, without Python's ``[Errno N]`` prefix (the file named when ``what`` does
    not already name it)."""
    reason = exc.strerror or str(exc)
    name = exc.filename if exc.filename is not None and str(exc.filename) not in what else None
    return f"{what}: {reason}" + (f": {name}" if name else "")


def yaml_error(source: str, exc: yaml.YAMLError) -> str:
    """One line for a YAML syntax error: ``file:line:column: invalid YAML: problem``."""
    mark = getattr(exc, "problem_mark", None)
    where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
    return f"{source}{where}: invalid YAML: {problem}"
