"""The machine-readable output formats of the CLI's commands (``-o json|yaml``), in one place."""

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
