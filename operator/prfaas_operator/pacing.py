"""Egress pacing of a Managed PrefillCluster's prefill pods (``spec.linkScheduling.egressPacing: PerInstance``).

The gateway's link calendar books each KV pull at what one pull achieves. Unpaced, a pull runs as fast as the
wire lets it, so on a tight link the cap fits fewer pulls than it has room for (a 5-Gbps link, 4-Gbps cap, 2.5-Gbps
pulls: one at a time, 1.5 Gbps idle). Paced, each prefill pod's egress is limited to cap / instances
(:func:`~prfaas_core.policy.link_calendar.paced_instance_gbps`) by Kubernetes' ``kubernetes.io/egress-bandwidth``
pod annotation, which the CNI's bandwidth plugin enforces; one pull per instance then fits and together they fill
the cap, and the gateway books each pull at that rate (:func:`.router_config.build_gateway`).

The operator writes the annotation into the workload's pod template (a LeaderWorkerSet: its leader and worker
templates, each pod an equal part of the instance's rate), so the pods restart once to take it, and stamps the
workload with :data:`~prfaas_core.names.ANNOTATION_EGRESS_PACED` (the rate it set): turning pacing off removes
only an annotation it set itself. Pure: the reconcile (:mod:`.prefill_cluster`) applies the merge patch.
"""

from __future__ import annotations

from typing import Any

from prfaas_core.api import PrefillCluster
from prfaas_core.names import ANNOTATION_EGRESS_BANDWIDTH, ANNOTATION_EGRESS_PACED
from prfaas_core.policy.link_calendar import paced_instance_gbps

from .kube import JsonDict


def paced_gbps(pfc: PrefillCluster) -> float | None:
    """Each prefill instance's egress limit, Gbps (None: not paced)."""
    ls = pfc.spec.link_scheduling
    if ls is None or ls.egress_pacing != "PerInstance":
        return None
    return paced_instance_gbps(ls.capacity_gbps, ls.max_utilization, max(1, pfc.spec.instances))


def bandwidth_quantity(gbps: float) -> str:
    """A rate as the bandwidth plugin's quantity (bits per second, in whole megabits)."""
    return f"{max(1, round(gbps * 1000))}M"


def _get(obj: Any, *keys: str) -> Any:
    for key in keys:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def pod_templates(workload: JsonDict) -> tuple[list[tuple[str, ...]], int]:
    """The paths of the workload's pod templates and the pods one instance has (a LeaderWorkerSet's ``size``)."""
    if workload.get("kind") == "LeaderWorkerSet":
        lwt = _get(workload, "spec", "leaderWorkerTemplate") or {}
        paths: list[tuple[str, ...]] = [("spec", "leaderWorkerTemplate", "workerTemplate")]
        if isinstance(lwt.get("leaderTemplate"), dict):  # absent: the leader uses the worker template
            paths.insert(0, ("spec", "leaderWorkerTemplate", "leaderTemplate"))
        size = lwt.get("size", 1)
        return paths, size if isinstance(size, int) and size >= 1 else 1
    return [("spec", "template")], 1


def _nest(path: tuple[str, ...], leaf: JsonDict) -> JsonDict:
    out = leaf
    for key in reversed(path):
        out = {key: out}
    return out


def _merge(a: JsonDict, b: JsonDict) -> JsonDict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def pacing_patch(workload: JsonDict, gbps: float | None) -> tuple[JsonDict, str] | None:
    """The merge patch that brings the workload's pod templates to the pacing wanted, and what it does for
    people (None: they already are). ``gbps``: each instance's limit, or None to remove what the operator set."""
    paths, size = pod_templates(workload)
    marker = _get(workload, "metadata", "annotations", ANNOTATION_EGRESS_PACED)
    current = [_get(workload, *path, "metadata", "annotations", ANNOTATION_EGRESS_BANDWIDTH) for path in paths]
    if gbps is None:
        mine = [path for path, value in zip(paths, current, strict=True) if marker is not None and value == marker]
        if marker is None:
            return None
        patch: JsonDict = {"metadata": {"annotations": {ANNOTATION_EGRESS_PACED: None}}}
        for path in mine:
            patch = _merge(patch, _nest(path, {"metadata": {"annotations": {ANNOTATION_EGRESS_BANDWIDTH: None}}}))
        return patch, f"egress pacing off: {ANNOTATION_EGRESS_BANDWIDTH} removed from {len(mine)} pod template(s)"
    want = bandwidth_quantity(gbps / size)
    if marker == want and all(value == want for value in current):
        return None
    patch = {"metadata": {"annotations": {ANNOTATION_EGRESS_PACED: want}}}
    for path in paths:
        patch = _merge(patch, _nest(path, {"metadata": {"annotations": {ANNOTATION_EGRESS_BANDWIDTH: want}}}))
    per_pod = f", {want} per pod of {size}" if size > 1 else ""
    return patch, f"egress paced: {ANNOTATION_EGRESS_BANDWIDTH}={want} ({gbps:g} Gbps per instance{per_pod})"
