"""The install guide rehearsed: docs/install.md's fenced commands, in order, against two Kubernetes API emulators
(region A and region B, the kubectl contexts the guide names), with the real helm and kubectl. Where the emulator
cannot serve a line as written, its declared equivalent runs instead, one table beside the guide's line
(install_rehearsal.EQUIVALENTS):

    the guide's line                      runs instead                                why
    kubectl --context C [-n NS] create    create --dry-run=client -o yaml | apply     create sends protobuf
    helm --kube-context C install|upgrade helm template | kubectl apply -n NS         no server-side apply
    kubectl --context C apply ...         ... --validate=false                        no OpenAPI document
    kubectl ... wait --for=condition=X    the condition polled on the emulator        its watch is undecodable
    kubectl ... port-forward svc/R L:P &  the router on the operator's ConfigMap      no kubelet, no pod
    curl -s localhost:L/PATH              curl that router's free port                8000 may be taken

and what the clusters themselves do (install_rehearsal.CLUSTER_DOES: the workload controllers make the engine pods
from the rendered templates; the chart's operator Deployment runs the operator with its rendered args) is done after
each chart install. Then both regions are checked: every PDCluster, InterDCLink and the Managed PrefillCluster
Ready, the engines running what the resources imply (EngineConfig True), the gateway's and the routers' configs
written by the operator and parsed as the router parses them, region A's token in region B.

The upgrade: the previous release's install (UPGRADE_FROM: its charts, values and the objects its guide applied,
hand-written engines included) is applied and reconciled, then docs/upgrade.md's commands (the charts, the old
engines' StatefulSets deleted, the current install's resources); every object must still validate and be
reconciled, the engines now matching their resources."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from install_rehearsal import EQUIVALENTS, REPO, TOOLS, Rehearsal, equivalent_of, guide_commands, object_path

from prfaas_core.api import ModelProfile, PDCluster
from prfaas_core.names import LABEL_PD_CLUSTER
from prfaas_operator.engine_config import engine_config as operator_engine_config
from prfaas_operator.router_config import CONFIG_KEY
from prfaas_router.state.config import parse_config
from prfaas_testbed.prom import wait_until

GUIDE = REPO / "docs" / "install.md"
UPGRADE = REPO / "docs" / "upgrade.md"
UPGRADE_DATA = REPO / "tests" / "data" / "upgrade"
UPGRADE_FROM = "e1fafcb"
"""The previous release's tree: 0.1.0 as its README and examples/03-helm/README.md installed it."""
NS = "prfaas"


@pytest.fixture(scope="module")
def tools() -> None:
    proc = subprocess.run(["bash", str(REPO / "scripts" / "helm-tools.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (TOOLS / "kubectl").exists() and (TOOLS / "helm").exists()


@pytest.fixture
def rehearsal(tmp_path: Path, tools: None) -> Iterator[Rehearsal]:
    r = Rehearsal(tmp_path)
    try:
        yield r
    finally:
        r.close()


def test_every_guide_line_the_emulator_cannot_serve_has_one_declared_equivalent() -> None:
    lines = guide_commands(GUIDE.read_text())
    assert len(lines) >= 20, lines
    for line in lines:
        hits = [e for e in EQUIVALENTS if equivalent_of(line) is not None and equivalent_of(line)[0] is e]
        assert len(hits) <= 1, line
    used = {equivalent_of(line)[0].pattern for line in lines if equivalent_of(line) is not None}
    assert used == {e.pattern for e in EQUIVALENTS}, "an equivalent no guide line needs"


def ready(r: Rehearsal, ctx: str, kind: str, name: str) -> dict[str, str]:
    cond = r.regions[ctx].condition(object_path(kind, NS, name), "Ready")
    assert cond is not None and cond["status"] == "True", (ctx, kind, name, cond, r.operator_log(ctx)[-3000:])
    return cond


def engine_config(r: Rehearsal, ctx: str, name: str, status: str = "True") -> dict[str, str]:
    path = object_path("PDCluster", NS, name)
    return dict(
        wait_until(
            lambda: (c := r.regions[ctx].condition(path, "EngineConfig")) and c["status"] == status and c,
            60,
            f"{ctx}: {name} EngineConfig {status}",
        )
    )


def resources(r: Rehearsal, ctx: str) -> list[dict[str, Any]]:
    """The PrFaaS objects a region holds, read back as manifests (apiVersion, kind, name, namespace, labels, spec)."""
    region = r.regions[ctx]
    docs = []
    for plural in ("modelprofiles", "prefillclusters", "pdclusters", "interdclinks"):
        scope = "" if plural == "modelprofiles" else f"/namespaces/{NS}"
        for o in region.items(f"/apis/prfaas.io/v1alpha1{scope}/{plural}"):
            meta = {k: v for k, v in o["metadata"].items() if k in ("name", "namespace", "labels")}
            docs.append({"apiVersion": o["apiVersion"], "kind": o["kind"], "metadata": meta, "spec": o["spec"]})
    return docs


def live_engine_config(r: Rehearsal) -> str:
    """The operator's own EngineConfig verdict on region B's live pods and resources, computed here (the operator
    publishes it at its next period)."""
    docs = {d["kind"]: d for d in resources(r, "region-b")}
    pd = PDCluster.model_validate(docs["PDCluster"])
    profile = ModelProfile.model_validate(docs["ModelProfile"])
    pods = [
        p
        for p in r.regions["region-b"].items(f"/api/v1/namespaces/{NS}/pods")
        if (p["metadata"].get("labels") or {}).get(LABEL_PD_CLUSTER) == "pd-h20"
    ]
    verdict = operator_engine_config(pd, profile, pods)
    return f"{verdict.status} {verdict.reason}: {verdict.message}"


def check_installed(r: Rehearsal, published: bool = True) -> None:
    a, b = r.regions["region-a"], r.regions["region-b"]
    ready(r, "region-a", "PrefillCluster", "prfaas-h200")
    ready(r, "region-b", "PDCluster", "pd-h20")
    ready(r, "region-b", "InterDCLink", "a-to-b")
    if published:
        assert engine_config(r, "region-b", "pd-h20")["reason"] == "Matches"
    assert live_engine_config(r).startswith("True Matches: 8 vLLM pods"), live_engine_config(r)
    # the gateway's config: the operator's, over region A's engine pods
    gw = a.get(object_path("ConfigMap", NS, "prfaas-h200-gateway-config"))
    assert gw is not None, r.operator_log("region-a")[-3000:]
    config = parse_config(gw["data"][CONFIG_KEY], "gateway")
    assert config.mode == "gateway" and len(config.endpoints) == 4
    assert config.gateway is not None and config.gateway.admission is not None
    # the routers' config: region B's engines, and region A's gateway reached with the copied Secrets
    cm = b.get(object_path("ConfigMap", NS, "pd-h20-router-config"))
    assert cm is not None
    routers = parse_config(cm["data"][CONFIG_KEY], "router")
    assert len(routers.endpoints) == 8
    assert [x.url for x in routers.remotes] == ["https://prefill-gateway.region-a.example.com"]
    token_a = a.get(object_path("Secret", NS, "prefill-gateway-token"))
    token_b = b.get(object_path("Secret", NS, "region-a-gateway-token"))
    assert (
        token_a and token_b and base64.b64decode(token_b["data"]["token"]) == base64.b64decode(token_a["data"]["token"])
    )
    assert len(base64.b64decode(token_a["data"]["token"])) == 64


def validate_objects(r: Rehearsal, ctx: str) -> None:
    """Every PrFaaS object the region holds, read back, passes `prfaas validate` (the current CRDs and models)."""
    docs = resources(r, ctx)
    assert docs
    path = r.tmp / f"{ctx}-objects.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    proc = subprocess.run(
        [sys.executable, "-m", "prfaas_cli.main", "validate", "--strict-references", str(path)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_install_guide_runs_as_written(rehearsal: Rehearsal) -> None:
    rehearsal.run_guide(GUIDE.read_text())
    check_installed(rehearsal)
    # the guide's last line: the router, on the operator's config, answers /ready with why it cannot serve yet (no
    # engine answers here) and the digest of the config it runs (sha256 of the file, NUL, no settings file)
    ready_answer = json.loads(rehearsal.outputs[-1])
    assert ready_answer["error"]["message"].startswith("not ready: "), ready_answer
    config = rehearsal.regions["region-b"].get(object_path("ConfigMap", NS, "pd-h20-router-config"))
    assert config is not None
    text = config["data"][CONFIG_KEY].replace("/var/run/prfaas/", f"{rehearsal.tmp / 'mnt-region-b'}/")
    assert ready_answer["config_digest"] == hashlib.sha256(text.encode() + b"\0").hexdigest()
    for ctx in ("region-a", "region-b"):
        validate_objects(rehearsal, ctx)


def test_the_upgrade_from_the_previous_release(rehearsal: Rehearsal) -> None:
    old = rehearsal.tmp / "previous"
    old.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", UPGRADE_FROM, "helm", "examples"], capture_output=True)
    assert archive.returncode == 0, f"the upgrade needs the repository's history ({UPGRADE_FROM}): {archive.stderr!r}"
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
    rehearsal.use_repo(old)
    rehearsal.run_guide((UPGRADE_DATA / "previous-install.md").read_text())
    # the previous install: reconciled, its hand-written engines not what the resources imply (the reason to upgrade)
    ready(rehearsal, "region-b", "PDCluster", "pd-h20")
    differs = engine_config(rehearsal, "region-b", "pd-h20", "False")
    assert differs["reason"] == "EngineFlagsDiffer" and "--kv-transfer-config" in differs["message"]

    rehearsal.use_repo(REPO)
    rehearsal.run_guide(UPGRADE.read_text())  # the charts, then the old StatefulSets deleted and the new resources
    # the current operator reconciled the new generation of the PrefillCluster and the link (a PDCluster's status
    # follows at its next period, policy.periodSeconds: 60 s here; its engines' verdict is computed below)
    for ctx, kind, name in (("region-a", "PrefillCluster", "prfaas-h200"), ("region-b", "InterDCLink", "a-to-b")):
        path = object_path(kind, NS, name)
        region = rehearsal.regions[ctx]
        wait_until(
            lambda region=region, path=path: (
                (c := region.condition(path, "Ready")) is not None
                and c["status"] == "True"
                and c.get("observedGeneration") == (region.get(path) or {})["metadata"].get("generation")
            ),
            60,
            f"{ctx}: {kind}/{name} Ready at its new generation",
        )
    check_installed(rehearsal, published=False)
    for ctx in ("region-a", "region-b"):
        validate_objects(rehearsal, ctx)
