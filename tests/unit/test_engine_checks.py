"""Validation of the engine configuration before deploy (`prfaas validate`): each bad combination is rejected
with the field and the reason; a hybrid model's connector limits are a warning."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from prfaas_cli.main import main
from prfaas_core.api import ModelProfile, PrefillCluster
from prfaas_core.schema.engine_checks import is_hybrid
from prfaas_core.schema.validation import model_issues

REPO = Path(__file__).resolve().parents[2]
EX04 = REPO / "examples" / "04-real-engines"


def _example() -> dict[str, Any]:
    return {p.relative_to(EX04).as_posix(): yaml.safe_load(p.read_text()) for p in sorted(EX04.rglob("*.yaml"))}


def _validate(tmp_path: Path, docs: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any]:
    for rel, body in docs.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(yaml.safe_dump_all(body if isinstance(body, list) else [body]))
    code = main(["validate", str(tmp_path), "-o", "json"])
    return code, json.loads(capsys.readouterr().out)


def _found(report: Any, kind: str, key: str = "issues") -> list[tuple[str, str]]:
    return [(i["path"], i["message"]) for o in report["objects"] if o["kind"] == kind for i in o[key]]


def test_the_example_is_valid_with_no_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _validate(tmp_path, _example(), capsys)
    assert code == 0, report
    assert all(not o["warnings"] for o in report["objects"])


PD = "region-b/pd-cluster.yaml"
PFC = "region-a/prefill-cluster.yaml"
REMOTE = "region-b/prefill-cluster-remote.yaml"


def _connector_mismatch(d: dict[str, Any]) -> None:
    d[PD]["spec"]["kvTransport"]["connector"] = "MooncakeConnector"


def _kv_role_vs_relabel(d: dict[str, Any]) -> None:
    d[PD]["spec"]["roleAssignment"] = {"mode": "Relabel"}
    d[PD]["spec"]["workloads"] = {"shared": {"kind": "StatefulSet", "name": "pd"}}
    d[PD]["spec"]["kvTransport"]["kvRole"] = "kv_producer"


def _kv_role_vs_scale(d: dict[str, Any]) -> None:
    d[PD]["spec"]["kvTransport"]["kvRole"] = "kv_consumer"


def _other_model(d: dict[str, Any]) -> None:
    other = copy.deepcopy(d["common/model-profile.yaml"])
    other["metadata"]["name"] = "tiny-llama-b"
    other["spec"]["servedModelName"] = "tiny-llama-2"
    d["common/other.yaml"] = other
    d[PD]["spec"]["modelProfileRef"]["name"] = "tiny-llama-b"


def _other_geometry(d: dict[str, Any]) -> None:
    other = copy.deepcopy(d["common/model-profile.yaml"])
    other["metadata"]["name"] = "tiny-llama-b"
    other["spec"]["architecture"]["kvHeads"] = 4
    d["common/other.yaml"] = other
    d[PD]["spec"]["modelProfileRef"]["name"] = "tiny-llama-b"


def _rdma_across(d: dict[str, Any]) -> None:
    d[REMOTE]["spec"]["kvTransport"]["protocol"] = "rdma"


def _side_channel_on_http(d: dict[str, Any]) -> None:
    d[PD]["spec"]["kvTransport"]["sideChannelPort"] = 8000


def _sglang(d: dict[str, Any]) -> None:
    d[PFC]["spec"]["kvTransport"]["connector"] = "SGLangMooncake"


@pytest.mark.parametrize(
    ("change", "kind", "path", "words"),
    [
        (_connector_mismatch, "PDCluster", "spec.kvTransport.connector", "same KV connector"),
        (_kv_role_vs_relabel, "PDCluster", "spec.kvTransport.kvRole", "Relabel"),
        (_kv_role_vs_scale, "PDCluster", "spec.kvTransport.kvRole", "Scale"),
        (_other_model, "PDCluster", "spec.modelProfileRef.name", "same model"),
        (_other_geometry, "PDCluster", "spec.modelProfileRef.name", "KV geometry"),
        (_rdma_across, "PDCluster", "spec.kvTransport.protocol", "Ethernet"),
        (_side_channel_on_http, "PDCluster", "spec.kvTransport.sideChannelPort", "HTTP port"),
        (_sglang, "PrefillCluster", "spec.kvTransport.connector", "NixlConnector"),
    ],
)
def test_bad_combinations_are_rejected_with_field_and_reason(
    change: Any, kind: str, path: str, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = _example()
    change(docs)
    code, report = _validate(tmp_path, docs, capsys)
    assert code == 1
    found = _found(report, kind)
    assert any(p == path and words in m for p, m in found), found


def test_engine_side_channel_port_on_http_port_is_a_cel_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = _example()
    docs[PFC]["spec"]["engine"]["sideChannelPort"] = 8000
    code, report = _validate(tmp_path, docs, capsys)
    assert code == 1
    sources = {(i["path"], i["source"]) for o in report["objects"] for i in o["issues"]}
    assert ("spec.engine.sideChannelPort", "cel") in sources  # the API server rejects it too
    # the model rejects it as well, reported once (the CRD's finding names the same field)
    _, by_model = model_issues(PrefillCluster, docs[PFC])
    assert any(i.path == "spec.engine.sideChannelPort" for i in by_model), by_model
    assert ("spec.engine.sideChannelPort", "model") not in sources


def test_hybrid_model_warns_naming_the_upstream_limitation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = _example()
    arch = docs["common/model-profile.yaml"]["spec"]["architecture"]
    arch.update({"linearLayers": 6, "linearStateBytesPerLayer": 1 << 20})
    code, report = _validate(tmp_path, docs, capsys)
    assert code == 0  # a warning, not an error
    warnings = _found(report, "PDCluster", "warnings")
    assert any(p == "spec.kvTransport.connector" and "NixlConnector" in m and "0.32" in m for p, m in warnings)


def test_measured_profiles_with_a_large_fixed_state_are_hybrid() -> None:
    hybrid = ModelProfile.model_validate(
        yaml.safe_load((REPO / "examples/01-two-region/common/model-profile.yaml").read_text())
    )
    assert is_hybrid(hybrid)
    plain = ModelProfile.model_validate(yaml.safe_load((EX04 / "common/model-profile.yaml").read_text()))
    assert not is_hybrid(plain)
