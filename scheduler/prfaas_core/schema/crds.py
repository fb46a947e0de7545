"""CustomResourceDefinitions generated from the API models (the models are the single source).

Pydantic's JSON schema is turned into a Kubernetes *structural* schema: ``$ref``s inlined, nullable
``anyOf`` collapsed to the inner type (optional = not required), JSON-Schema-2020 exclusive bounds turned
into OpenAPI v3.0's boolean form, titles dropped, ``additionalProperties: false`` dropped (structural
schemas prune unknown fields; ``kubectl`` and ``prfaas validate`` reject them). CEL rules declared on the
models arrive as ``x-kubernetes-validations``. Pure: returns dicts; the CLI writes the YAML.
"""

from __future__ import annotations

import copy
from functools import lru_cache
from typing import Any

from ..api.resources import KINDS, ResourceKind
from ..names import API_GROUP, API_VERSION

JsonDict = dict[str, Any]

_DROP_KEYS = frozenset({"title", "examples", "additionalProperties_false"})


def _resolve(node: Any, defs: JsonDict) -> Any:
    """Inline every ``$ref`` (sibling keys override the referenced schema's)."""
    if isinstance(node, list):
        return [_resolve(x, defs) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        merged = copy.deepcopy(defs[name])
        for k, v in node.items():
            if k != "$ref":
                merged[k] = v
        return _resolve(merged, defs)
    return {k: _resolve(v, defs) for k, v in node.items()}


def _collapse_nullable(node: JsonDict) -> JsonDict:
    any_of = node.get("anyOf")
    if isinstance(any_of, list):
        non_null = [s for s in any_of if s.get("type") != "null"]
        if len(non_null) == 1 and len(non_null) < len(any_of):
            inner = dict(non_null[0])
            for k, v in node.items():
                if k != "anyOf":
                    inner.setdefault(k, v)
            if inner.get("default", 0) is None:
                del inner["default"]
            return inner
    return node


def structural(node: Any) -> Any:
    """Turn a resolved pydantic JSON schema into a structural OpenAPI v3 schema."""
    if isinstance(node, list):
        return [structural(x) for x in node]
    if not isinstance(node, dict):
        return node
    node = _collapse_nullable(node)
    out: JsonDict = {}
    for key, value in node.items():
        if key in _DROP_KEYS:
            continue
        if key == "additionalProperties" and value is False:
            continue
        if key == "const":
            out["enum"] = [value]
            continue
        if key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            out[bound] = value
            out[key] = True
            continue
        if key == "properties":
            out[key] = {name: structural(sub) for name, sub in value.items()}
            continue
        out[key] = structural(value)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if out.get("default", 0) is None:
        del out["default"]
    return out


def kind_schema(kind: ResourceKind) -> JsonDict:
    """The openAPIV3Schema of one kind."""
    raw = kind.model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    resolved = _resolve(raw, defs)
    props = resolved["properties"]
    spec = structural(props["spec"])
    status = structural(props["status"])
    schema: JsonDict = {
        "type": "object",
        "description": resolved.get("description", kind.kind),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "API version of the object."},
            "kind": {"type": "string", "description": "Kind of the object."},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    return schema


def subresources(kind: ResourceKind) -> JsonDict:
    """``status`` always; ``scale`` where the kind has one (an HPA/KEDA drives ``spec.instances``)."""
    subs: JsonDict = {"status": {}}
    if kind.scale:
        subs["scale"] = {
            "specReplicasPath": ".spec.instances",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        }
    return subs


def build_crd(kind: ResourceKind) -> JsonDict:
    """A complete apiextensions.k8s.io/v1 CustomResourceDefinition for one kind."""
    columns = []
    for col in kind.columns:
        entry: JsonDict = {
            "name": col.name,
            "type": col.type,
            "jsonPath": col.json_path,
            "description": col.description,
        }
        if col.priority:
            entry["priority"] = col.priority
        columns.append(entry)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": kind.crd_name,
            "labels": {
                "app.kubernetes.io/part-of": "prfaas",
                "app.kubernetes.io/managed-by": "prfaas-crdgen",
            },
        },
        "spec": {
            "group": API_GROUP,
            "scope": "Namespaced" if kind.namespaced else "Cluster",
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.singular,
                "shortNames": list(kind.short_names),
                "categories": list(kind.categories),
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": subresources(kind),
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": kind_schema(kind)},
                }
            ],
        },
    }


def all_crds() -> dict[str, JsonDict]:
    """File name -> CRD, for every kind."""
    return {f"{k.crd_name}.yaml": build_crd(k) for k in KINDS}


@lru_cache(maxsize=1)
def crd_schema_by_kind() -> dict[str, JsonDict]:
    """Kind -> openAPIV3Schema (what ``prfaas validate`` checks custom resources against). Cached: treat the
    result as read-only."""
    return {k.kind: kind_schema(k) for k in KINDS}
