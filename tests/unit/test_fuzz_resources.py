"""Property-based fuzzing of the custom resources: the examples' objects with one field replaced, removed or
added at random. Every variant gets an answer, never a traceback: either the typed models accept it, or every
issue names a field and says why; and whatever the CRD schema (with its CEL rules) accepts, the typed models
accept too or reject with a field and a reason (the operator parses the same models)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from prfaas_core.names import GROUP_VERSION
from prfaas_core.schema.check import cel_environment, check_against_crd
from prfaas_core.schema.crds import crd_schema_by_kind
from prfaas_core.schema.validation import Document, check_document

cel_environment()  # raises the recursion limit once, before hypothesis starts watching it
REPO = Path(__file__).resolve().parents[2]
OBJECTS = [
    d
    for f in sorted((REPO / "examples" / "01-two-region").rglob("*.yaml"))
    for d in yaml.safe_load_all(f.read_text())
    if isinstance(d, dict) and d.get("apiVersion") == GROUP_VERSION
]
LEAF: st.SearchStrategy[Any] = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=False, allow_infinity=False, width=32), st.text(max_size=20),
    st.sampled_from(["", "0", "-1", "Relabel", "Scale", "Managed", "Remote", "H200", "1e9", "https://x"]),
)  # fmt: skip
VALUE = st.recursive(
    LEAF, lambda v: st.lists(v, max_size=3) | st.dictionaries(st.text(max_size=8), v, max_size=3), max_leaves=8
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def variants(draw: st.DrawFn) -> dict[str, Any]:
    obj = copy.deepcopy(draw(st.sampled_from(OBJECTS)))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(obj["spec"])))
        parent: Any = obj["spec"]
        for part in path[:-1]:
            parent = parent[part]
        op = draw(st.sampled_from(["replace", "delete", "add"]))
        if not path:
            obj["spec"] = draw(VALUE) if op == "replace" else obj["spec"]
            continue
        last = path[-1]
        if op == "replace":
            parent[last] = draw(VALUE)
        elif op == "delete":
            del parent[last]
        elif isinstance(parent[last], dict):
            parent[last][draw(st.text(min_size=1, max_size=10))] = draw(VALUE)
    return obj


@settings(max_examples=150)
@given(variants())
def test_any_variant_is_accepted_or_rejected_with_a_field_and_a_reason(obj: dict[str, Any]) -> None:
    checked = check_document(Document("fuzz", 0, obj))
    assert checked.model is not None or checked.issues
    for issue in checked.issues:
        assert issue.message.strip(), issue
        assert issue.path or issue.message, issue
    schema_issues = check_against_crd(crd_schema_by_kind()[obj["kind"]], obj)
    if not schema_issues:  # the API server would store it: the operator must read it or say what is wrong
        model_issues = [i for i in checked.issues if i.source == "model"]
        assert checked.model is not None or all(i.path and i.message for i in model_issues), checked.issues
