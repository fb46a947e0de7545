"""Offline admission: check a custom resource the way the API server would, from the generated CRD schema.

What the API server does on create, in order, and what this module mirrors:
1. defaulting from the schema (``default`` on properties of objects that are present);
2. OpenAPI v3 schema validation, with *strict* field validation (unknown fields are errors, as with
   ``kubectl apply`` since 1.27), and ``x-kubernetes-list-type: map`` key uniqueness;
3. ``x-kubernetes-validations`` CEL rules, evaluated with cel-python (core CEL only: comparisons, ``has()``,
   ``size()``, ternaries; Kubernetes' CEL extension libraries are not available offline, so our rules avoid
   them). Fields of schema type ``number`` are doubles in CEL, as in Kubernetes.

What it cannot prove: server-side apply, RBAC, admission webhooks (docs/planning.md says so).
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import celpy
import jsonschema
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

JsonDict = dict[str, Any]
IssueSource = Literal["schema", "cel", "model", "reference", "document", "engine", "graph"]


@dataclass(frozen=True)
class Issue:
    """One problem with one object: which field, why, and which checker found it."""

    path: str
    message: str
    source: IssueSource

    def __str__(self) -> str:
        return f"{self.path or '<object>'}: {self.message} [{self.source}]"


def format_path(parts: Any) -> str:
    """``('spec', 'points', 0, 'kvMiB')`` -> ``spec.points[0].kvMiB``."""
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += f".{p}" if out else str(p)
    return out


def apply_defaults(schema: JsonDict, value: Any) -> Any:
    """Return a copy of ``value`` with schema defaults filled in (Kubernetes structural defaulting)."""
    value = copy.deepcopy(value)
    _default_in_place(schema, value)
    return value


def _default_in_place(schema: JsonDict, value: Any) -> None:
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                _default_in_place(sub, value[name])
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            _default_in_place(schema["items"], item)


def _strict(schema: JsonDict) -> JsonDict:
    """Copy of ``schema`` where objects with declared properties reject unknown fields."""
    out: JsonDict = {}
    for key, val in schema.items():
        if key == "properties":
            out[key] = {n: _strict(s) for n, s in val.items()}
        elif (key == "items" and isinstance(val, dict)) or (key == "additionalProperties" and isinstance(val, dict)):
            out[key] = _strict(val)
        else:
            out[key] = val
    if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def _list_map_issues(schema: JsonDict, value: Any, path: list[Any]) -> list[Issue]:
    issues: list[Issue] = []
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                issues += _list_map_issues(sub, value[name], [*path, name])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        keys = schema.get("x-kubernetes-list-map-keys")
        if schema.get("x-kubernetes-list-type") == "map" and keys:
            seen: set[tuple[Any, ...]] = set()
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    key = tuple(repr(item.get(k)) for k in keys)
                    if key in seen:
                        issues.append(
                            Issue(
                                format_path([*path, i]),
                                f"Duplicate value: {', '.join(keys)} repeated",
                                "schema",
                            )
                        )
                    seen.add(key)
        for i, item in enumerate(value):
            issues += _list_map_issues(schema["items"], item, [*path, i])
    return issues


@lru_cache(maxsize=1)
def cel_environment() -> celpy.Environment:
    """The one CEL environment, built on first use (building it parses CEL's grammar, ~0.3 s, and raises
    the interpreter's recursion limit)."""
    return celpy.Environment()


@lru_cache(maxsize=512)
def _cel_program(rule: str) -> celpy.Runner:
    env = cel_environment()
    return env.program(env.compile(rule))


def _as_cel_json(schema: JsonDict, value: Any) -> Any:
    """Make numbers of schema type ``number`` floats (CEL doubles), recursively."""
    if isinstance(value, dict):
        props = schema.get("properties", {})
        return {k: _as_cel_json(props.get(k, {}), v) for k, v in value.items()}
    if isinstance(value, list):
        items = schema.get("items", {})
        return [_as_cel_json(items if isinstance(items, dict) else {}, v) for v in value]
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _cel_issues(schema: JsonDict, value: Any, path: list[Any]) -> list[Issue]:
    issues: list[Issue] = []
    for rule in schema.get("x-kubernetes-validations", []):
        try:
            result = _cel_program(rule["rule"]).evaluate({"self": json_to_cel(_as_cel_json(schema, value))})
        except CELEvalError as exc:  # a rule that cannot run is a bug in our CRDs: say so loudly
            issues.append(Issue(format_path(path), f"CEL rule {rule['rule']!r} failed to evaluate: {exc}", "cel"))
            continue
        if isinstance(result, CELEvalError):
            issues.append(Issue(format_path(path), f"CEL rule {rule['rule']!r} failed: {result}", "cel"))
        elif not bool(result):
            field = format_path(path) + rule.get("fieldPath", "")
            issues.append(Issue(field, rule["message"], "cel"))
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                issues += _cel_issues(sub, value[name], [*path, name])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            issues += _cel_issues(schema["items"], item, [*path, i])
    return issues


@lru_cache(maxsize=16)
def _validator(schema_json: str) -> jsonschema.Draft4Validator:
    return jsonschema.Draft4Validator(_strict(json.loads(schema_json)))


def check_against_crd(schema: JsonDict, obj: JsonDict) -> list[Issue]:
    """Every issue the API server would report creating ``obj`` under a CRD with this schema."""
    defaulted = apply_defaults(schema, obj)
    validator = _validator(json.dumps(schema, sort_keys=True))
    issues = [_schema_issue(err) for err in validator.iter_errors(defaulted)]
    issues.sort(key=lambda i: i.path)
    issues += _list_map_issues(schema, defaulted, [])
    if not issues:  # like the API server: CEL runs on objects that passed the schema
        issues += _cel_issues(schema, defaulted, [])
    return issues


_REQUIRED = re.compile(r"^'(.+)' is a required property$")


def _schema_issue(err: jsonschema.ValidationError) -> Issue:
    """Name the offending field itself (for a missing or unknown field: the field, not its parent)."""
    path = list(err.absolute_path)
    if err.validator == "required":
        match = _REQUIRED.match(err.message)
        if match:
            return Issue(format_path([*path, match.group(1)]), "Required value: field is required", "schema")
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        declared = err.schema.get("properties", {}) if isinstance(err.schema, dict) else {}
        extra = sorted(set(err.instance) - set(declared))
        return Issue(format_path([*path, extra[0]]), f"unknown field(s) {', '.join(map(repr, extra))}", "schema")
    return Issue(format_path(path), err.message, "schema")
