"""Engine configuration rendered from the custom resources (prfaas_core.launch.render, `prfaas engines`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from prfaas_cli.engines_cmd import render_files
from prfaas_cli.main import main
from prfaas_core.api import ModelProfile, PDCluster, PrefillCluster
from prfaas_core.launch.kinds import engine_launch
from prfaas_core.launch.render import RenderError, cluster_launches, engine_specs, launch_diff

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "data" / "golden"
EX01 = REPO / "examples" / "01-two-region"
EX04 = REPO / "examples" / "04-real-engines"


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _profile() -> ModelProfile:
    return ModelProfile.model_validate(_load(EX04 / "common" / "model-profile.yaml"))


def _pd(**spec: Any) -> PDCluster:
    body = _load(EX04 / "region-b" / "pd-cluster.yaml")
    body["spec"].update(spec)
    return PDCluster.model_validate(body)


def _prefill(**spec: Any) -> PrefillCluster:
    body = _load(EX04 / "region-a" / "prefill-cluster.yaml")
    body["spec"].update(spec)
    return PrefillCluster.model_validate(body)


@pytest.mark.parametrize(
    ("example", "golden"), [(EX01, "engines-01-two-region.json"), (EX04, "engines-04-real-engines.json")]
)
def test_prfaas_engines_matches_the_golden_files(
    example: Path, golden: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["engines", str(example), "-o", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = json.loads((GOLDEN / golden).read_text())
    assert printed == expected, (
        f"rendered engines differ from {golden}; if the change is intended: "
        f"prfaas engines {example.relative_to(REPO)} -o json > tests/data/golden/{golden}"
    )


def test_two_region_example_is_mooncake_tcp_at_tp8_both_ends() -> None:
    rendered = render_files([str(EX01)])
    assert set(rendered) == {"prfaas-h200", "pd-h20"}  # the Remote description in region B renders nothing
    prfaas = rendered["prfaas-h200"]["prfaas-prefill"]
    pd = rendered["pd-h20"]["pd-both"]  # Relabel mode: one workload whose instances flip
    for launch, kv_role in ((prfaas, "kv_producer"), (pd, "kv_both")):
        args = launch["args"]
        assert isinstance(args, list)
        kv = json.loads(args[args.index("--kv-transfer-config") + 1])
        assert kv == launch["kvTransferConfig"]
        assert kv["kv_connector"] == "MooncakeConnector"
        assert kv["kv_role"] == kv_role
        assert kv["kv_connector_extra_config"] == {"mooncake_protocol": "tcp"}
        assert args[args.index("--tensor-parallel-size") + 1] == "8"
        assert args[args.index("--model") + 1] == "/models/hybrid-1t"
        assert args[args.index("--served-model-name") + 1] == "hybrid-1t"
        assert {"name": "VLLM_MOONCAKE_BOOTSTRAP_PORT", "value": "8998"} in launch["env"]  # type: ignore[operator]


def test_scale_mode_renders_a_producer_and_a_consumer_workload() -> None:
    launches = cluster_launches(_pd(), _profile())
    assert set(launches) == {"pd-prefill", "pd-decode"}
    assert launches["pd-prefill"].kv_transfer_config["kv_role"] == "kv_producer"
    assert launches["pd-decode"].kv_transfer_config["kv_role"] == "kv_consumer"
    env = {e.name: e.value for e in launches["pd-decode"].env}
    assert env["UCX_TLS"] == "tcp"
    assert env["UCX_NET_DEVICES"] == "eth0"
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"


def test_the_output_is_engine_launch_of_the_specs() -> None:
    """One function: what `prfaas engines` prints is engine_launch of the rendered specs, nothing added."""
    for cluster in (_pd(), _prefill()):
        for role, spec in engine_specs(cluster, _profile()).items():
            assert cluster_launches(cluster, _profile())[role] == engine_launch(spec)


@pytest.mark.parametrize(
    ("cluster", "field", "words"),
    [
        (lambda: _pd(kvTransport={"kvRole": "kv_producer"}), "spec.kvTransport.kvRole", "Scale"),
        (
            lambda: _pd(
                roleAssignment={"mode": "Relabel"},
                workloads={"shared": {"kind": "StatefulSet", "name": "x"}},
                kvTransport={"kvRole": "kv_consumer"},
            ),
            "spec.kvTransport.kvRole",
            "kv_both",
        ),
        (lambda: _prefill(kvTransport={"kvRole": "kv_consumer"}), "spec.kvTransport.kvRole", "kv_producer"),
        (lambda: _prefill(kvTransport={"sideChannelPort": 8000}), "spec.kvTransport.sideChannelPort", "HTTP port"),
        (lambda: _prefill(engine={"extraArgs": ["--kv-transfer-config={}"]}), "spec.engine.extraArgs[0]", "rendered"),
        (lambda: _prefill(engine={"extraArgs": ["--block-size", "16"]}), "spec.engine.extraArgs[0]", "rendered"),
    ],
)
def test_bad_combinations_name_the_field_and_the_reason(cluster: Any, field: str, words: str) -> None:
    with pytest.raises(RenderError) as err:
        engine_specs(cluster(), _profile())
    assert err.value.field == field
    assert words in err.value.reason


def test_a_profile_without_served_model_name_cannot_render() -> None:
    body = _load(EX04 / "common" / "model-profile.yaml")
    del body["spec"]["servedModelName"]
    with pytest.raises(RenderError, match=r"spec\.servedModelName"):
        engine_specs(_prefill(), ModelProfile.model_validate(body))


def test_cli_rejects_a_cluster_that_cannot_render(tmp_path: Path) -> None:
    body = _load(EX04 / "region-a" / "prefill-cluster.yaml")
    body["spec"]["kvTransport"]["kvRole"] = "kv_consumer"
    (tmp_path / "pfc.yaml").write_text(yaml.safe_dump(body))
    (tmp_path / "mp.yaml").write_text((EX04 / "common" / "model-profile.yaml").read_text())
    done = subprocess.run(
        [sys.executable, "-m", "prfaas_cli.main", "engines", str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 1
    assert "PrefillCluster/prfaas-cpu: spec.kvTransport.kvRole" in done.stderr


def test_launch_diff_names_the_differing_flag_and_variable() -> None:
    launch = cluster_launches(_pd(), _profile())["pd-decode"]
    container = launch.to_json()
    assert launch_diff(launch, container) == []
    args = list(container["args"])  # type: ignore[call-overload]
    i = args.index("--kv-transfer-config")
    args[i + 1] = '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}'
    env = [e for e in container["env"] if e["name"] != "UCX_TLS"]  # type: ignore[attr-defined]
    diffs = launch_diff(launch, {**container, "args": args, "env": env})
    assert [d.what for d in diffs] == ["--kv-transfer-config", "env UCX_TLS"]
    assert diffs[1].expected == "tcp"
    assert diffs[1].actual is None
    # an engine started without its KV connector at all (the silent failure: it recomputes everything)
    bare = {"args": [a for a in args if a != args[i] and a != args[i + 1]], "env": container["env"]}
    assert [d.what for d in launch_diff(launch, bare)] == ["--kv-transfer-config"]
