"""The chart's opt-in engine workloads: their command, args and env are exactly what the one engine-flag function
renders from the custom resources (prfaas engines -o helm-values -> files/engines.json or --set-file), the
cross-region KV path needs security.acknowledgeUnencryptedKv, and the engine NetworkPolicies admit HTTP only
from the routers/gateway and the KV ports only from engines and the peer CIDRs. kubernetes-validate checks the
core kinds; LeaderWorkerSet (no schema there) is checked structurally. Enforcement is not checked here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from test_helm import CHART, K8S_VERSION, NAMESPACE, helm, render, run_helm

from prfaas_cli.engines_cmd import helm_values, load_clusters
from prfaas_core.launch.render import cluster_launches

__all__ = ["helm"]  # the session fixture of test_helm

REPO = Path(__file__).resolve().parents[2]
EX04 = REPO / "examples" / "04-real-engines"
VALUES = REPO / "examples" / "03-helm" / "real-engines"


def _expected() -> dict[tuple[str, str], dict[str, Any]]:
    clusters, profiles = load_clusters([str(REPO / "examples/01-two-region"), str(EX04)])
    out = {}
    for c in clusters:
        if c.kind == "PrefillCluster" and c.spec.mode == "Remote":
            continue
        for role, launch in cluster_launches(c, profiles[c.spec.model_profile_ref.name]).items():
            out[(c.metadata.name, role)] = launch.to_json()
    return out


def _pods(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for d in docs:
        if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") != "engine":
            continue  # the gateway is a StatefulSet too
        if d["kind"] == "StatefulSet":
            out[d["metadata"]["name"]] = d["spec"]["template"]
        elif d["kind"] == "LeaderWorkerSet":
            assert d["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
            assert d["spec"]["leaderWorkerTemplate"]["size"] >= 1
            out[d["metadata"]["name"]] = d["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    return out


@pytest.mark.parametrize("region", ["a", "b"])
def test_rendered_engine_containers_are_the_functions_output(helm: str, region: str) -> None:
    values = VALUES / f"values-region-{region}.yaml"
    docs = render(helm, CHART, values)
    wanted = yaml.safe_load(values.read_text())["engines"]["workloads"]
    pods = _pods(docs)
    assert set(pods) == {w["name"] for w in wanted}
    expected = _expected()
    for w in wanted:
        container = next(c for c in pods[w["name"]]["spec"]["containers"] if c["name"] == "engine")
        launch = expected[(w["cluster"], w["role"])]
        assert container["command"] == launch["command"]
        assert container["args"] == launch["args"]
        assert container["env"] == launch["env"]
        labels = pods[w["name"]]["metadata"]["labels"]
        assert labels[f"prfaas.io/{'prefill' if w['role'] == 'prfaas-prefill' else 'pd'}-cluster"] == w["cluster"]
        if w["role"] in ("pd-prefill", "pd-decode"):
            assert labels["prfaas.io/role"] == w["role"].removeprefix("pd-")
    for d in docs:
        if d["kind"] in ("StatefulSet", "Service", "NetworkPolicy"):
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)


def test_the_shipped_engine_args_file_is_the_examples_rendering() -> None:
    shipped = json.loads((CHART / "files" / "engines.json").read_text())
    assert shipped == helm_values([str(REPO / "examples/01-two-region"), str(EX04)])


def test_cross_region_engines_need_the_unencrypted_kv_acknowledgement(helm: str) -> None:
    values = VALUES / "values-region-a.yaml"
    proc = run_helm(
        helm, "template", "prfaas", str(CHART), "-n", NAMESPACE, "-f", str(values),
        "--set", "security.acknowledgeUnencryptedKv=false",
    )  # fmt: skip
    assert proc.returncode != 0
    assert "tiny-llama-prefill is crossRegion" in proc.stderr
    assert "security.acknowledgeUnencryptedKv=true" in proc.stderr
    notes = run_helm(helm, "install", "prfaas", str(CHART), "-n", NAMESPACE, "-f", str(values), "--dry-run=client")
    assert "WARNING: security.acknowledgeUnencryptedKv=true" in notes.stdout
    assert "UNENCRYPTED" in notes.stdout


def test_engine_network_policies(helm: str, tmp_path: Path) -> None:
    # the example with a pinned KV data range (kvTransport.dataPorts -> UCX_TCP_PORT_RANGE)
    for f in EX04.rglob("*.yaml"):
        body = yaml.safe_load(f.read_text())
        if body["kind"] == "PrefillCluster" and body["spec"]["mode"] == "Managed":
            body["spec"]["kvTransport"]["dataPorts"] = {"start": 20000, "end": 20063}
        (tmp_path / f.name).write_text(yaml.safe_dump(body))
    launches = tmp_path / "engines.json"
    launches.write_text(json.dumps(helm_values([str(tmp_path)])))
    docs = render(helm, CHART, VALUES / "values-region-a.yaml", "--set-file", f"engines.launchesJson={launches}")
    pod = _pods(docs)["tiny-llama-prefill"]["spec"]["containers"][0]
    assert {"name": "UCX_TCP_PORT_RANGE", "value": "20000-20063"} in pod["env"]
    policy = next(
        d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("tiny-llama-prefill")
    )
    http, kv = policy["spec"]["ingress"]
    assert http["ports"] == [{"port": "http", "protocol": "TCP"}]
    sources = http["from"][0]["podSelector"]["matchExpressions"][0]["values"]
    assert sources == ["router", "gateway"]
    assert {"ipBlock": {"cidr": "10.20.0.0/16"}} in kv["from"]  # the peer region, only for the KV ports
    assert kv["ports"] == [
        {"port": "kv-side", "protocol": "TCP"},
        {"port": 20000, "endPort": 20063, "protocol": "TCP"},
    ]
    kubernetes_validate.validate(policy, K8S_VERSION, strict=True)
    # a crossRegion workload without peer CIDRs is refused under networkPolicy.enabled
    proc = run_helm(
        helm, "template", "prfaas", str(CHART), "-n", NAMESPACE, "-f", str(VALUES / "values-region-a.yaml"),
        "--set", "engines.peerCidrs=null",
    )  # fmt: skip
    assert proc.returncode != 0 and "engines.peerCidrs is required" in proc.stderr


def test_an_unknown_cluster_or_role_is_named(helm: str) -> None:
    proc = run_helm(
        helm, "template", "prfaas", str(CHART), "-n", NAMESPACE, "--set", "engines.enabled=true",
        "--set", "engines.workloads[0].name=x", "--set", "engines.workloads[0].cluster=pd-cpu",
        "--set", "engines.workloads[0].role=pd-both",
    )  # fmt: skip
    assert proc.returncode != 0
    assert 'cluster pd-cpu renders no role "pd-both" (it has pd-decode, pd-prefill)' in proc.stderr
