"""Region A's operator and its Managed PrefillCluster, against the emulator: the prefill pods observed (status),
the prefill gateway configured (the RouterConfig ConfigMap the chart's gateway mounts, kept current as pods come
and go), and the ConfigMap removed with the PrefillCluster (owner reference + finalizer). A Remote
PrefillCluster owns nothing and carries no finalizer."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import yaml

from prfaas_core.names import ANNOTATION_EGRESS_BANDWIDTH, ANNOTATION_EGRESS_PACED, LABEL_PREFILL_CLUSTER
from prfaas_operator.router_config import CONFIG_KEY, gateway_configmap_name
from prfaas_router.state.config import parse_config
from prfaas_testbed.operator_harness import EXAMPLE, Harness
from prfaas_testbed.prom import wait_until

pytestmark = pytest.mark.timeout(180)

PFC = "prfaas-h200"
CM = gateway_configmap_name(PFC)


def managed_prefill_cluster(ns: str, profile: str) -> dict[str, Any]:
    """examples/01-two-region/region-a/prefill-cluster.yaml in ``ns``, on a Deployment (the emulator serves no
    LeaderWorkerSet)."""
    doc = yaml.safe_load((EXAMPLE / "region-a" / "prefill-cluster.yaml").read_text())
    doc["metadata"]["namespace"] = ns
    doc["spec"]["modelProfileRef"]["name"] = profile
    doc["spec"]["workload"] = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "prefill-engines"}
    return dict(doc)


def prefill_pod(ns: str, i: int, ready: bool) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"prefill-engines-{i}", "namespace": ns, "labels": {LABEL_PREFILL_CLUSTER: PFC}},
        "spec": {"containers": [{"name": "engine", "ports": [{"name": "http", "containerPort": 8000}]}]},
        "status": {
            "phase": "Running",
            "podIP": f"10.0.0.{10 + i}",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def gateway_config(h: Harness, ns: str) -> dict[str, Any] | None:
    cm = h.get("ConfigMap", ns, CM)
    return json.loads(cm["data"][CONFIG_KEY]) if cm else None


def endpoint_names(h: Harness, ns: str) -> list[str]:
    return [e["name"] for e in (gateway_config(h, ns) or {}).get("endpoints") or []]


def test_managed_prefill_cluster_observes_its_pods_and_configures_its_gateway(h: Harness) -> None:
    ns = h.namespace()
    op = h.start_operator(ns)
    profile = next(d for d in h.manifests(ns) if d["kind"] == "ModelProfile")
    h.create(profile)
    h.create(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "prefill-engines", "namespace": ns},
            "spec": {"replicas": 2, "selector": {"matchLabels": {LABEL_PREFILL_CLUSTER: PFC}}},
        }
    )
    h.create(prefill_pod(ns, 0, ready=True))
    h.create(prefill_pod(ns, 1, ready=False))
    h.create(managed_prefill_cluster(ns, profile["metadata"]["name"]))

    # the gateway's RouterConfig: a valid gateway-mode config listing the labelled pods, secrets where mounted
    config = wait_until(lambda: gateway_config(h, ns), 30, "the gateway ConfigMap")
    parsed = parse_config(json.dumps(config), CONFIG_KEY)
    assert parsed.mode == "gateway" and parsed.gateway is not None and parsed.gateway.prefill_cluster == PFC
    assert [(e.name, e.url, e.role) for e in parsed.endpoints] == [
        ("prefill-engines-0", "http://10.0.0.10:8000", "prefill"),
        ("prefill-engines-1", "http://10.0.0.11:8000", "prefill"),
    ]  # the gateway health-checks engines itself; readiness decides the status below
    assert parsed.gateway.token_file == "/var/run/prfaas/gateway/token/token"
    assert parsed.gateway.tls_cert_file == "/var/run/prfaas/gateway/tls/tls.crt"
    assert parsed.gateway.tls_key_file == "/var/run/prfaas/gateway/tls/tls.key"
    assert parsed.prfaas_hardware is not None and parsed.prfaas_hardware.accelerator == "H200"
    assert parsed.model.served_model_name == profile["spec"]["servedModelName"]
    pfc = h.get("PrefillCluster", ns, PFC)
    cm = h.get("ConfigMap", ns, CM)
    assert pfc is not None and cm is not None
    owner = cm["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("PrefillCluster", PFC, pfc["metadata"]["uid"])
    assert cm["metadata"]["labels"][LABEL_PREFILL_CLUSTER] == PFC
    assert cm["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway"
    assert "prfaas.io/finalizer" in pfc["metadata"]["finalizers"]

    # status from the observed pods: one of two ready
    wait_until(lambda: h.status(ns, PFC, "PrefillCluster").get("lastSyncTime"), 30, "the status synced")
    assert h.status(ns, PFC, "PrefillCluster")["readyInstances"] == 1
    cond = h.condition(ns, "Ready", PFC, "PrefillCluster")
    assert cond["status"] == "True" and cond["reason"] == "InstancesReady" and "1 of 4" in cond["message"]

    # pods come and go: the gateway follows (a pod event nudges its PrefillCluster), and so does the status
    h.create(prefill_pod(ns, 2, ready=True))
    h.patch("Pod", ns, "prefill-engines-1", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    wait_until(lambda: len(endpoint_names(h, ns)) == 3, 20, "the new pod in the gateway config")
    wait_until(lambda: h.status(ns, PFC, "PrefillCluster").get("readyInstances") == 3, 20, "3 ready")
    h.delete("Pod", ns, "prefill-engines-0")
    wait_until(lambda: endpoint_names(h, ns) == ["prefill-engines-1", "prefill-engines-2"], 20, "the pod removed")
    wait_until(lambda: h.status(ns, PFC, "PrefillCluster").get("readyInstances") == 2, 20, "2 ready")

    # deletion: the finalizer removes the gateway ConfigMap, then lets the PrefillCluster go
    h.delete("PrefillCluster", ns, PFC)
    wait_until(lambda: h.get("PrefillCluster", ns, PFC) is None, 20, "the PrefillCluster gone")
    assert h.get("ConfigMap", ns, CM) is None
    op.stop()


def test_remote_prefill_cluster_owns_nothing_and_has_no_finalizer(h: Harness) -> None:
    ns = h.namespace()
    op = h.start_operator(ns)
    h.setup(ns, except_kinds=("PDCluster",))
    remote = next(d for d in h.manifests(ns) if d["kind"] == "PrefillCluster")
    wait_until(lambda: h.condition(ns, "Ready", remote["metadata"]["name"], "PrefillCluster"), 30, "remote synced")
    body = h.get("PrefillCluster", ns, remote["metadata"]["name"])
    assert body is not None and not body["metadata"].get("finalizers")
    assert not [c for c in h.list("ConfigMap", ns) if c["metadata"]["name"].endswith("-gateway-config")]
    # a Managed one without labelled pods says why it has no ready instance
    profile = next(d for d in h.manifests(ns) if d["kind"] == "ModelProfile")["metadata"]["name"]
    managed = managed_prefill_cluster(ns, profile)
    managed["metadata"]["name"] = "local-prefill"
    managed["spec"]["workload"]["name"] = "pd-engines"
    h.create(managed)
    cond = wait_until(
        lambda: (
            h.condition(ns, "Ready", "local-prefill", "PrefillCluster").get("reason") == "NoReadyInstances"
            and h.condition(ns, "Ready", "local-prefill", "PrefillCluster")
        ),
        30,
        "no ready instances",
    )
    assert "no pods labelled prfaas.io/prefill-cluster=local-prefill" in cond["message"]
    cm = wait_until(lambda: h.get("ConfigMap", ns, gateway_configmap_name("local-prefill")), 20, "its gateway config")
    assert json.loads(cm["data"][CONFIG_KEY])["endpoints"] == []  # published all the same: pods may come later
    op.stop()


def test_a_rotated_gateway_token_secret_is_read_again(h: Harness) -> None:
    """The operator reads each Secret once per tick, not once per start: a rotated token reaches the gateway."""
    ns = h.namespace()
    op = h.start_operator(ns)
    h.setup(ns, except_kinds=("PDCluster",))
    remote = next(d for d in h.manifests(ns) if d["kind"] == "PrefillCluster")
    name = remote["metadata"]["name"]
    secret = remote["spec"]["endpoint"]["tokenSecretRef"]
    wait_until(lambda: h.condition(ns, "Ready", name, "PrefillCluster").get("status") == "True", 30, "remote synced")
    h.gateway.token = "rotated-token"  # the gateway rotates first: the old token is refused
    cond = wait_until(
        lambda: (c := h.condition(ns, "Ready", name, "PrefillCluster")).get("reason") == "GatewayUnreachable" and c,
        30,
        "the old token refused",
    )
    assert "HTTP 401" in cond["message"]
    h.patch("Secret", ns, secret["name"], {"data": {secret["key"]: base64.b64encode(b"rotated-token").decode()}})
    wait_until(lambda: h.condition(ns, "Ready", name, "PrefillCluster").get("status") == "True", 30, "synced again")
    assert h.gateway.auth[-1] == "Bearer rotated-token"
    op.stop()


def test_a_managed_to_remote_change_removes_the_old_gateway_config(h: Harness) -> None:
    ns = h.namespace()
    op = h.start_operator(ns)
    profile = next(d for d in h.manifests(ns) if d["kind"] == "ModelProfile")
    h.create(profile)
    h.create(prefill_pod(ns, 0, ready=True))
    h.create(managed_prefill_cluster(ns, profile["metadata"]["name"]))
    wait_until(lambda: gateway_config(h, ns), 30, "the gateway ConfigMap")
    remote = yaml.safe_load((EXAMPLE / "region-b" / "prefill-cluster-remote.yaml").read_text())
    h.patch(
        "PrefillCluster",
        ns,
        PFC,
        {"spec": {"mode": "Remote", "workload": None, "linkScheduling": None, "endpoint": remote["spec"]["endpoint"]}},
    )
    wait_until(lambda: h.get("ConfigMap", ns, CM) is None, 30, "the old gateway ConfigMap removed")
    assert h.get("PrefillCluster", ns, PFC) is not None
    op.stop()


def test_egress_pacing_limits_each_prefill_pod_and_the_gateway_books_pulls_at_that_rate(h: Harness) -> None:
    """linkScheduling.egressPacing PerInstance: the operator writes kubernetes.io/egress-bandwidth = cap / instances
    into the workload's pod template (the example: 100 Gbps x 0.8 over 4 instances = 20 Gbps) and the gateway books
    each pull at 20 Gbps; turned off, it removes its own annotation and keeps one a person set by hand."""
    ns = h.namespace()
    op = h.start_operator(ns)
    profile = next(d for d in h.manifests(ns) if d["kind"] == "ModelProfile")
    h.create(profile)
    template = {"metadata": {"labels": {LABEL_PREFILL_CLUSTER: PFC}}, "spec": {"containers": [{"name": "engine"}]}}
    h.create(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "prefill-engines", "namespace": ns},
            "spec": {"replicas": 4, "selector": {"matchLabels": {LABEL_PREFILL_CLUSTER: PFC}}, "template": template},
        }
    )
    h.create(prefill_pod(ns, 0, ready=True))
    pfc = managed_prefill_cluster(ns, profile["metadata"]["name"])
    pfc["spec"]["linkScheduling"]["egressPacing"] = "PerInstance"
    pfc["spec"]["linkScheduling"].pop("pullGbps", None)
    h.create(pfc)

    def template_annotations() -> dict[str, str]:
        body = h.get("Deployment", ns, "prefill-engines") or {}
        return dict(body["spec"]["template"]["metadata"].get("annotations") or {})

    wait_until(lambda: template_annotations().get(ANNOTATION_EGRESS_BANDWIDTH) == "20000M", 30, "the pods paced")
    deployment = h.get("Deployment", ns, "prefill-engines")
    assert deployment is not None and deployment["metadata"]["annotations"][ANNOTATION_EGRESS_PACED] == "20000M"
    assert deployment["spec"]["template"]["spec"]["containers"] == [{"name": "engine"}]  # the rest untouched
    admission = wait_until(lambda: (gateway_config(h, ns) or {}).get("gateway", {}).get("admission"), 30, "admission")
    assert admission["pullGbps"] == pytest.approx(20.0) and admission["link"] == "a-to-b"
    assert admission["instanceGbps"] == pytest.approx(20.0)  # one pod's pulls share its paced egress
    events = [e for e in h.events(ns) if e.get("reason") == "EgressPacing"]
    assert events and "20000M" in events[0]["message"] and "restart" in events[0]["message"]

    # pacing off: the operator's annotation goes, and the gateway books pulls at the replica's share again
    h.patch("PrefillCluster", ns, PFC, {"spec": {"linkScheduling": {"egressPacing": "None"}}})
    wait_until(lambda: ANNOTATION_EGRESS_BANDWIDTH not in template_annotations(), 30, "the pacing removed")
    deployment = h.get("Deployment", ns, "prefill-engines")
    assert deployment is not None and ANNOTATION_EGRESS_PACED not in (deployment["metadata"].get("annotations") or {})
    wait_until(
        lambda: (
            "pullGbps" not in ((gateway_config(h, ns) or {}).get("gateway", {}).get("admission") or {"pullGbps": 1})
        ),
        30,
        "the gateway's pulls unpaced",
    )
    # one set by hand (no marker of the operator's) is left alone
    h.patch(
        "Deployment",
        ns,
        "prefill-engines",
        {"spec": {"template": {"metadata": {"annotations": {ANNOTATION_EGRESS_BANDWIDTH: "5000M"}}}}},
    )
    h.patch("PrefillCluster", ns, PFC, {"metadata": {"labels": {"nudge": "1"}}})
    wait_until(lambda: h.status(ns, PFC, "PrefillCluster").get("lastSyncTime"), 30, "a sync")
    assert template_annotations().get(ANNOTATION_EGRESS_BANDWIDTH) == "5000M"
    op.stop()
