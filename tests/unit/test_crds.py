"""The CRDs are generated from the models, are structural, use only core CEL, and pass kubernetes-validate."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from prfaas_cli.crds_cmd import render_all
from prfaas_core.api import KINDS
from prfaas_core.schema.crds import all_crds

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "crds"


def test_checked_in_crds_are_byte_identical_to_generated() -> None:
    files = render_all()
    on_disk = {p.name for p in CRDS.iterdir()}
    assert on_disk == set(files), "crds/ has files no model generates, or lacks some: run `prfaas crds`"
    for name, content in files.items():
        assert (CRDS / name).read_text(encoding="utf-8") == content, f"{name} is stale: run `prfaas crds`"


def test_generation_is_deterministic() -> None:
    assert render_all() == render_all()


def _walk(schema: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    out = [(path, schema)]
    for name, sub in schema.get("properties", {}).items():
        out += _walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        out += _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        out += _walk(schema["additionalProperties"], f"{path}{{}}")
    return out


CRD_OBJECTS = all_crds()


@pytest.mark.parametrize("name", sorted(CRD_OBJECTS))
def test_schema_is_structural(name: str) -> None:
    schema = CRD_OBJECTS[name]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema, ""):
        assert "type" in node, f"{name}{path}: no type"
        for banned in ("$ref", "anyOf", "oneOf", "allOf", "not", "title", "const", "nullable"):
            assert banned not in node, f"{name}{path}: {banned} is not allowed in a structural schema"
        assert not ("properties" in node and "additionalProperties" in node), f"{name}{path}"
        if isinstance(node.get("exclusiveMinimum"), (int, float)) and not isinstance(node["exclusiveMinimum"], bool):
            pytest.fail(f"{name}{path}: exclusiveMinimum must be boolean in OpenAPI v3.0")
        if node["type"] == "array":
            assert "maxItems" in node, f"{name}{path}: unbounded list (CEL cost)"


_CALL = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\(")


@pytest.mark.parametrize("name", sorted(CRD_OBJECTS))
def test_cel_rules_use_core_cel_only_and_field_paths_exist(name: str) -> None:
    schema = CRD_OBJECTS[name]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = 0
    for path, node in _walk(schema, ""):
        for rule in node.get("x-kubernetes-validations", []):
            rules += 1
            assert set(_CALL.findall(rule["rule"])) <= {"has", "size"}, rule["rule"]
            assert rule["message"] and rule["reason"].startswith("Field")
            target = node
            for part in rule.get("fieldPath", "").strip(".").split("."):
                if part:
                    assert part in target.get("properties", {}), f"{name}{path}: fieldPath {rule['fieldPath']}"
                    target = target["properties"][part]
    kind = CRD_OBJECTS[name]["spec"]["names"]["kind"]
    assert rules > 0, f"{kind} has no CEL rules"


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_printer_columns_point_at_schema_fields(kind: Any) -> None:
    crd = CRD_OBJECTS[f"{kind.crd_name}.yaml"]
    version = crd["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    if kind.scale:  # an HPA/KEDA drives spec.instances; status.replicas and status.selector are declared
        scale = version["subresources"]["scale"]
        assert scale == {
            "specReplicasPath": ".spec.instances",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        }
        props = schema["properties"]
        assert props["spec"]["properties"]["instances"]["type"] == "integer"
        assert props["status"]["properties"]["replicas"]["type"] == "integer"
        assert props["status"]["properties"]["selector"]["type"] == "string"
    else:
        assert version["subresources"] == {"status": {}}
    for col in version["additionalPrinterColumns"]:
        path = col["jsonPath"]
        if path.startswith(".metadata"):
            continue
        path = re.sub(r"\[\?\(.*?\)\]", "[]", path)
        node = schema
        for part in path.strip(".").split("."):
            if part.endswith("[]"):
                node = node["properties"][part[:-2]]["items"]
            else:
                assert part in node.get("properties", {}), f"{kind.kind}: column {col['name']} -> {col['jsonPath']}"
                node = node["properties"][part]


def test_kubernetes_validate_strict_1_30() -> None:
    exe = shutil.which("kubernetes-validate") or str(Path(sys.executable).parent / "kubernetes-validate")
    files = sorted(str(p) for p in CRDS.glob("*.yaml"))
    assert len(files) == len(KINDS)
    result = subprocess.run(
        [exe, "--strict", "-k", "1.30.0", *files], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed") == len(KINDS), result.stdout


def test_crd_files_are_valid_yaml_with_header() -> None:
    for path in CRDS.glob("*.yaml"):
        text = path.read_text()
        assert text.startswith("# Generated by `prfaas crds`")
        assert yaml.safe_load(text)["kind"] == "CustomResourceDefinition"
