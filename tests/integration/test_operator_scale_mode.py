"""Scale-mode actuation end to end: the operator as a real process against the Kubernetes API emulator and a
real Prometheus, with a PDCluster whose prefill and decode instances live in two Deployments.

A flip drains first (the draining label, drain-started and a low pod-deletion-cost on the chosen pod), then
retires the drained pod and writes the two replica counts through the ``scale`` subresource — the receiving
workload up first, the giving one down second, each exactly once and by the operator alone. The emulator
has no Deployment controller, so the test plays it (:func:`controller_sync`): it creates pods up to each
Deployment's replicas and removes the surplus lowest pod-deletion-cost first, as a ReplicaSet does.
"""

from __future__ import annotations

import base64
import itertools
from typing import Any

import pytest

from prfaas_core.names import (
    ANNOTATION_DRAIN_STARTED,
    ANNOTATION_LAST_FLIP,
    ANNOTATION_POD_DELETION_COST,
    LABEL_DRAINING,
    LABEL_PD_CLUSTER,
    LABEL_ROLE,
)
from prfaas_testbed.operator_harness import GATEWAY_TOKEN, Harness
from prfaas_testbed.prom import wait_until

pytestmark = pytest.mark.timeout(240)

WORKLOADS = {"prefill": "pd-prefill", "decode": "pd-decode"}
PD = "pd-h20"


_ports = itertools.count(9000)


def make_pod(h: Harness, ns: str, workload: str, role: str, name: str) -> None:
    h.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": {LABEL_PD_CLUSTER: PD, LABEL_ROLE: role, "app": workload},
            },
            "spec": {"containers": [{"name": "engine", "ports": [{"name": "http", "containerPort": next(_ports)}]}]},
            "status": {"phase": "Running", "podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
        }
    )


def setup_scale(h: Harness, ns: str, prefill: int = 3, decode: int = 5) -> None:
    """The gateway secret, two Deployments with their pods (roles from the pod template), the four objects."""
    h.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "region-a-gateway-token", "namespace": ns},
            "data": {"token": base64.b64encode(GATEWAY_TOKEN.encode()).decode()},
        }
    )
    for role, replicas in (("prefill", prefill), ("decode", decode)):
        name = WORKLOADS[role]
        labels = {LABEL_PD_CLUSTER: PD, LABEL_ROLE: role, "app": name}
        h.create(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name, "namespace": ns},
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": labels}},
                },
            }
        )
        for i in range(replicas):
            make_pod(h, ns, name, role, f"{name}-{i}")
    workloads = {role: {"kind": "Deployment", "name": name} for role, name in WORKLOADS.items()}
    for doc in h.manifests(ns, workloads=workloads, roleAssignment={"mode": "Scale"}):
        h.create(doc)


def controller_sync(h: Harness, ns: str) -> tuple[list[str], list[str]]:
    """What the ReplicaSet controller would do: (created, deleted) pod names."""
    created, deleted = [], []
    for role, name in WORKLOADS.items():
        replicas = int(h.get("Deployment", ns, name)["spec"]["replicas"])
        pods = [p for p in h.list("Pod", ns) if (p["metadata"].get("labels") or {}).get("app") == name]
        if len(pods) > replicas:

            def cost(p: dict[str, Any]) -> tuple[int, str]:
                ann = p["metadata"].get("annotations") or {}
                return int(ann.get(ANNOTATION_POD_DELETION_COST, "0")), p["metadata"]["name"]

            for p in sorted(pods, key=cost)[: len(pods) - replicas]:
                h.delete("Pod", ns, p["metadata"]["name"])
                deleted.append(p["metadata"]["name"])
        taken = {p["metadata"]["name"] for p in pods}
        fresh = (f"{name}-{i}" for i in itertools.count() if f"{name}-{i}" not in taken)
        for _ in range(replicas - len(pods)):
            pod = next(fresh)
            make_pod(h, ns, name, role, pod)
            created.append(pod)
    return created, deleted


def replicas(h: Harness, ns: str) -> dict[str, int]:
    return {role: int(h.get("Deployment", ns, name)["spec"]["replicas"]) for role, name in WORKLOADS.items()}


def workload_writes(h: Harness, ns: str) -> list[tuple[str, str, Any]]:
    """Every create/update of a Deployment (or its scale subresource) in ``ns`` after the test created them."""
    prefix = f"/apis/apps/v1/namespaces/{ns}/deployments"
    return [w for w in h.emu.k8s.write_log if w[1].startswith(prefix) and w[0] != "POST"]


def decisions(h: Harness, ns: str) -> list[dict[str, Any]]:
    return list(h.status(ns).get("decisions") or [])


def flips(h: Harness, ns: str) -> list[dict[str, Any]]:
    return [d for d in decisions(h, ns) if d["action"].startswith("Flip")]


def counts(h: Harness, ns: str) -> dict[str, tuple[int, int, int]]:
    """role -> (current, desired, ready) as the PDCluster status reports them."""
    st = h.status(ns)
    return {r: (st[r]["current"], st[r]["desired"], st[r]["ready"]) for r in ("prefill", "decode")}


def test_shift_towards_prefill_drains_then_scales_prefill_up_before_decode_down(h: Harness) -> None:
    ns = h.namespace()
    op = h.start_operator(ns)
    setup_scale(h, ns, 3, 5)
    wait_until(lambda: counts(h, ns) == {"prefill": (3, 3, 3), "decode": (5, 5, 5)}, 30, "3/5 reported")
    t_before = wait_until(lambda: h.status(ns).get("thresholdMinTokens"), 30, "t_min published")
    assert replicas(h, ns) == {"prefill": 3, "decode": 5}
    assert workload_writes(h, ns) == []
    # no relabelling in Scale mode: the roles come from the pod templates and stay as they are
    assert sorted(h.roles(ns).values()) == ["decode"] * 5 + ["prefill"] * 3

    h.prom.exporter.running[(ns, "pd-decode-0")] = 3  # busy: the drain picks the least loaded decode pod
    h.prom.exporter.set_queue(ns, PD, "prefill", 40)
    wait_until(lambda: replicas(h, ns) == {"prefill": 4, "decode": 4}, 60, "prefill 4 / decode 4 replicas")
    drained = [p["metadata"]["name"] for p in h.list("Pod", ns) if p["metadata"]["labels"].get(LABEL_DRAINING)]
    assert drained == ["pd-decode-1"], drained

    # the order of the writes: drain the pod, retire it, prefill up, decode down — one scale write each
    log = [(m, path, body) for m, path, body in h.emu.k8s.write_log if m == "PATCH"]
    pod_path = f"/api/v1/namespaces/{ns}/pods/pd-decode-1"

    def first(pred: Any) -> int:
        return next(i for i, w in enumerate(log) if pred(w))

    i_drain = first(lambda w: w[1] == pod_path and (w[2]["metadata"].get("labels") or {}).get(LABEL_DRAINING))
    drain_ann = log[i_drain][2]["metadata"]["annotations"]
    assert drain_ann[ANNOTATION_POD_DELETION_COST] == "-1000" and ANNOTATION_DRAIN_STARTED in drain_ann
    i_retire = first(lambda w: w[1] == pod_path and ANNOTATION_LAST_FLIP in (w[2]["metadata"].get("annotations") or {}))
    scale = [(i, w) for i, w in enumerate(log) if "/deployments/" in w[1]]
    assert [(w[1].rsplit("/", 2)[-2:], w[2]) for _, w in scale] == [
        (["pd-prefill", "scale"], {"spec": {"replicas": 4}}),
        (["pd-decode", "scale"], {"spec": {"replicas": 4}}),
    ]
    assert i_drain < i_retire < scale[0][0] < scale[1][0]

    st = wait_until(lambda: h.status(ns) if flips(h, ns) else None, 20, "the flip recorded")
    flip = flips(h, ns)[-1]
    assert flip["action"] == "FlipToPrefill" and "prefill-bound" in flip["reason"] and "drained" in flip["reason"]
    assert (flip["prefillFrom"], flip["prefillTo"], flip["decodeFrom"], flip["decodeTo"]) == (3, 4, 5, 4)
    actions = [d["action"] for d in decisions(h, ns)]
    assert actions.index("Drain") < actions.index("FlipToPrefill")
    # before the workload controller acts: the retired pod no longer counts, the new one is not there yet;
    # desired follows the replica counts written, cycle after cycle (not the pods that happen to exist)
    assert counts(h, ns) == {"prefill": (3, 4, 3), "decode": (4, 4, 4)}
    wait_until(lambda: h.status(ns)["lastDecision"]["action"] != "FlipToPrefill", 20, "a cycle after the flip")
    op.wait_cycles(2)
    assert counts(h, ns) == {"prefill": (3, 4, 3), "decode": (4, 4, 4)}
    assert st["summary"]["prefill"] == "3/4"

    created, deleted = controller_sync(h, ns)
    assert deleted == ["pd-decode-1"] and created == ["pd-prefill-3"]  # the drained pod goes, by its low cost
    wait_until(lambda: counts(h, ns) == {"prefill": (4, 4, 4), "decode": (4, 4, 4)}, 30, "4/4 reported")
    st = h.status(ns)
    assert st["summary"]["prefill"] == "4/4" and st["summary"]["decode"] == "4/4"
    # t re-optimised for the new split and published to the routers: the new pod in, the drained one out
    assert st["thresholdMinTokens"] > t_before
    cm = wait_until(
        lambda: (
            (c := h.get("ConfigMap", ns, f"{PD}-router-config"))
            and "pd-prefill-3" in c["data"]["router-config.json"]
            and c
        ),
        20,
        "router config with the new prefill pod",
    )
    text = cm["data"]["router-config.json"]
    assert "pd-decode-1" not in text and f'"thresholdMinTokens": {st["thresholdMinTokens"]}' in text
    assert {"Drain", "FlipToPrefill"} <= {e["reason"] for e in h.events(ns)}

    # the queue still stands, but the cooldown holds: no more scale writes, one writer, one write each
    op.wait_cycles(2)
    assert len(workload_writes(h, ns)) == 2 and len(flips(h, ns)) == 1
    assert replicas(h, ns) == {"prefill": 4, "decode": 4}
    assert "cooldown" in h.status(ns)["lastDecision"]["reason"]
    assert f'prfaas_operator_role_instances{{namespace="{ns}",pd_cluster="{PD}",role="prefill"}} 4.0' in op.metrics()
    op.stop()


def test_steady_load_does_not_scale_then_decode_pressure_scales_decode_up_first(h: Harness) -> None:
    ns = h.namespace()
    op = h.start_operator(ns)
    setup_scale(h, ns, 3, 5)
    wait_until(lambda: len(decisions(h, ns)) >= 1 and h.status(ns)["loop"], 30, "a first cycle")
    wait_until(lambda: h.condition(ns, "Degraded").get("status") == "False", 30, "metrics flowing")
    op.wait_cycles(3)  # several 1 s periods of steady load
    assert workload_writes(h, ns) == [] and flips(h, ns) == []
    assert replicas(h, ns) == {"prefill": 3, "decode": 5}
    assert not any(p["metadata"]["labels"].get(LABEL_DRAINING) for p in h.list("Pod", ns))
    last = h.status(ns)["lastDecision"]
    assert last["action"] == "Hold" and "no standing queue" in last["reason"]

    # the other direction: decode queues -> a prefill pod drains, decode grows first, prefill shrinks second
    h.prom.exporter.set_queue(ns, PD, "decode", 60)
    wait_until(lambda: replicas(h, ns) == {"prefill": 2, "decode": 6}, 60, "prefill 2 / decode 6 replicas")
    writes = workload_writes(h, ns)
    assert [(w[1].rsplit("/", 2)[-2], w[2]["spec"]["replicas"]) for w in writes] == [
        ("pd-decode", 6),
        ("pd-prefill", 2),
    ]
    flip = wait_until(lambda: flips(h, ns)[-1] if flips(h, ns) else None, 20, "the flip recorded")
    assert flip["action"] == "FlipToDecode" and "decode-bound" in flip["reason"]
    created, deleted = controller_sync(h, ns)
    assert deleted == ["pd-prefill-0"] and created == ["pd-decode-5"]
    wait_until(lambda: counts(h, ns) == {"prefill": (2, 2, 2), "decode": (6, 6, 6)}, 30, "2/6 reported")
    op.stop()


def test_a_flip_interrupted_after_the_retirement_is_resumed_not_lost(h: Harness) -> None:
    ns = h.namespace()
    op = h.start_operator(ns)
    setup_scale(h, ns, 3, 5)
    wait_until(lambda: counts(h, ns) == {"prefill": (3, 3, 3), "decode": (5, 5, 5)}, 30, "3/5 reported")
    # the first scale write is refused past the client's retries: the pod is retired, no count is written
    fault = h.emu.k8s.inject("PATCH", rf"/namespaces/{ns}/deployments/pd-prefill/scale$", 500, count=6)
    h.prom.exporter.set_queue(ns, PD, "prefill", 40)
    wait_until(lambda: fault.count == 0, 60, "the scale write refused")
    # the next reconcile finishes it from the retired pod's marks: the same absolute counts, once
    wait_until(lambda: replicas(h, ns) == {"prefill": 4, "decode": 4}, 60, "prefill 4 / decode 4 replicas")
    retired = [p for p in h.list("Pod", ns) if ANNOTATION_LAST_FLIP in (p["metadata"].get("annotations") or {})]
    assert len(retired) == 1
    wait_until(
        lambda: (
            "prfaas.io/scale-targets"
            not in (h.get("Pod", ns, retired[0]["metadata"]["name"]) or {}).get("metadata", {}).get("annotations", {})
        ),
        30,
        "the marks removed",
    )
    op.wait_cycles(2)  # cycles go by (the cooldown holds): the counts are not written again nor changed
    assert replicas(h, ns) == {"prefill": 4, "decode": 4}
    assert len([w for w in workload_writes(h, ns) if w[0] == "PATCH"]) == 2
    op.stop()
