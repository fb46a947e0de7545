"""A PD cluster's pods, read: their roles, readiness and drain marks, the loop's observation, and the loop
state the pods carry across restarts.

Level-based: the pending drain comes back from the pods' ``prfaas.io/draining`` label and ``drain-started``
annotation, the last flip from ``last-role-flip`` and the decision history in status, ``t_min`` and the
``t`` in force from status — so a restarted operator resumes a drain and keeps the cooldown instead of
flipping again. Only the persistence streak lives in memory (and in ``status.loop``, for restarts).
Pods are other objects' state (kubelet's), so they are read as the API gives them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prfaas_core.api import PDClusterStatus, PrefillClusterStatus
from prfaas_core.names import ANNOTATION_DRAIN_STARTED, ANNOTATION_LAST_FLIP, LABEL_DRAINING, LABEL_ROLE
from prfaas_core.policy.long_term import LoopState
from prfaas_core.policy.role_types import (
    InstanceState,
    PendingFlip,
    Role,
    RoleObservation,
    RoleState,
    StageLoad,
    Verdict,
)

from .kube import JsonDict
from .observe import ClusterMetrics
from .status import parse_iso

ROLES: tuple[Role, Role] = ("prefill", "decode")


def labels_of(pod: JsonDict) -> dict[str, str]:
    return pod.get("metadata", {}).get("labels") or {}


def annotations_of(pod: JsonDict) -> dict[str, str]:
    return pod.get("metadata", {}).get("annotations") or {}


def name(pod: JsonDict) -> str:
    return str(pod["metadata"]["name"])


def role(pod: JsonDict) -> Role | None:
    r = labels_of(pod).get(LABEL_ROLE)
    return "prefill" if r == "prefill" else "decode" if r == "decode" else None


def is_draining(pod: JsonDict) -> bool:
    return labels_of(pod).get(LABEL_DRAINING) == "true"


def retired(pod: JsonDict) -> bool:
    """Scale mode: a drained pod whose flip was carried out waits for its workload to remove it."""
    if not is_draining(pod):
        return False
    flipped = parse_iso(annotations_of(pod).get(ANNOTATION_LAST_FLIP))
    started = parse_iso(annotations_of(pod).get(ANNOTATION_DRAIN_STARTED))
    return flipped is not None and (started is None or flipped >= started)


def pod_ready(pod: JsonDict) -> bool:
    status = pod.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    return ready.get("status") == "True" if ready else status.get("phase") == "Running"


def unassigned(pods: Iterable[JsonDict]) -> tuple[str, ...]:
    return tuple(name(p) for p in pods if role(p) is None)


def instances(pods: Iterable[JsonDict], in_flight: Mapping[str, float] | None = None) -> tuple[InstanceState, ...]:
    """The instances with a role, their work in flight (from the metrics, when given) and drain marks."""
    out = []
    for p in pods:
        r = role(p)
        if r is not None:
            n = name(p)
            flight = round((in_flight or {}).get(n, 0.0))
            # a pod no kubelet has reported on yet (no status) is not counted dead
            healthy = pod_ready(p) if p.get("status") else True
            out.append(InstanceState(n, r, flight, is_draining(p), healthy=healthy))
    return tuple(out)


def observation(
    pods: Iterable[JsonDict], metrics: ClusterMetrics, prefill_clusters: Iterable[PrefillClusterStatus]
) -> RoleObservation:
    """The loop's observation: the instances, the PD stages' queues and KV use, the PrFaaS clusters' queues
    and ready instances (from their synced status)."""
    prfaas_queue, ready = 0.0, None
    for st in prefill_clusters:
        ok = next((c for c in st.conditions if c.type == "Ready"), None)
        if ok is not None and ok.status == "True" and st.last_sync_time:
            prfaas_queue += st.queue_depth
            ready = (ready or 0) + st.ready_instances

    def stage(r: Role) -> StageLoad:
        return StageLoad(metrics.queue_depth.get(r, 0.0), metrics.kv_cache_usage.get(r, 0.0))

    return RoleObservation(
        instances(pods, metrics.in_flight),
        prefill=stage("prefill"),
        decode=stage("decode"),
        prfaas=StageLoad(prfaas_queue),
        n_prfaas_ready=ready,
    )


def _pending(pods: list[JsonDict], status: PDClusterStatus, now_s: float) -> PendingFlip | None:
    draining = [p for p in pods if is_draining(p) and not retired(p)]
    roles = {role(p) for p in draining}
    if not draining or len(roles) != 1 or not roles <= set(ROLES):
        return None
    started = [parse_iso(annotations_of(p).get(ANNOTATION_DRAIN_STARTED)) for p in draining]
    known_started = [s for s in started if s is not None]
    last = status.last_decision
    reason = last.reason if last is not None and last.action == "Drain" else ""
    reason = reason.split(": draining")[0] or "resumed drain"
    return PendingFlip(
        "FlipToDecode" if roles == {"prefill"} else "FlipToPrefill",
        tuple(name(p) for p in draining),
        min(known_started) if known_started else now_s,
        reason,
    )


def restore_state(
    pods: list[JsonDict],
    status: PDClusterStatus,
    verdict: Verdict | None,
    streak: int,
    last_run_s: float | None,
    now_s: float,
) -> LoopState:
    """The loop's state, rebuilt from the cluster (see the module docstring)."""
    flips = [parse_iso(annotations_of(p).get(ANNOTATION_LAST_FLIP)) for p in pods]
    flips += [parse_iso(d.time) for d in status.decisions if d.action.startswith("Flip")]
    known = [f for f in flips if f is not None]
    roles = RoleState(
        verdict, streak, max(known) if known else None, _pending(pods, status, now_s), status.threshold_min_tokens
    )
    return LoopState(roles, status.threshold_tokens, tuple(status.decisions), last_run_s)


def counts(pods: list[JsonDict], r: Role) -> tuple[int, int, int]:
    """(current, ready, draining) instances of one role."""
    mine = [p for p in pods if role(p) == r]
    return len(mine), sum(1 for p in mine if pod_ready(p)), sum(1 for p in mine if is_draining(p))
