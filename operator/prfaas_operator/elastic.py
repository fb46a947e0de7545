"""Elastic capacity, carried out: one cluster's workload sized through its ``scale`` subresource (issue 47).

Each region sizes what it owns, and only that: region A's operator its Managed PrefillClusters (the site), region
B's its PDClusters (the total; the role loop keeps splitting whatever instances there are). The decision is the
core's (:func:`prfaas_core.policy.elastic.decide_scale`); this module reads the workload, decides, and acts:

- ``Fixed``: nothing here (``spec.instances`` is what a person set; the workload is theirs).
- ``External``: the desired count is ``spec.instances``, which an HPA/KEDA writes through the cluster's
  ``/scale``; the operator follows it and decides nothing (it never writes ``spec.instances`` back).
- ``Operator``: the desired count comes from the demand the cluster's engines report; it lives in
  ``status.scaling.desiredInstances`` and in the workload's replicas, never in ``spec.instances``.

Scale-out writes the workload's replicas at once (absolute, idempotent). Scale-in drains first: the pods to go
(a StatefulSet's or LeaderWorkerSet's highest ordinals, which it removes; a Deployment's not-ready, then least busy
ones) get the
``prfaas.io/draining`` label (routers and the gateway send them nothing new and release their unpulled KV), the
``prfaas.io/scale-in=draining`` mark and the lowest ``pod-deletion-cost``; once none of them has work in flight
(or ``drainTimeoutSeconds`` passed) the replicas are lowered and the marks turn to ``removed`` (the workload
deletes those pods; they count for nothing meanwhile). Demand that comes back while they drain un-drains them.
Events: ScaledOut, ScaleInDraining, ScaledIn, ScaleOutBlocked, and ScaleOutPending when instances stay not ready
past ``startupSeconds`` after a scale (Pending pods: no free GPUs). The decision's memory (its recent recommendations)
lives in this process; a restarted operator starts its scale-down window afresh (it never scales in on its
first look) and takes its desired count from status.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prfaas_core.api import WorkloadRef
from prfaas_core.api.scaling import ScalingSpec, ScalingStatus
from prfaas_core.names import (
    ANNOTATION_DRAIN_STARTED,
    ANNOTATION_POD_DELETION_COST,
    ANNOTATION_SCALE_IN,
    LABEL_DRAINING,
)
from prfaas_core.policy.elastic import ScaleBehavior, ScaleBounds, ScaleMemory, decide_scale, forecast, seeded

from .actuate import workload_path
from .kube import JsonDict, KubeApi, api_path
from .metrics import OperatorMetrics
from .pods import annotations_of, name, pod_ready
from .registry import Entry, World
from .status import iso, parse_iso, post_event

DRAINING, REMOVED = "draining", "removed"


def scale_in_mark(pod: JsonDict) -> str | None:
    return annotations_of(pod).get(ANNOTATION_SCALE_IN)


def removed(pod: JsonDict) -> bool:
    """A pod a scale-in already took the replica away from: its workload deletes it; it counts for nothing."""
    return scale_in_mark(pod) == REMOVED


def _ordinal(pod: JsonDict) -> int:
    m = re.search(r"-(\d+)(?:-\d+)?$", name(pod))
    return int(m.group(1)) if m else -1


@dataclass
class ElasticRuntime:
    memory: ScaleMemory = field(default_factory=ScaleMemory)
    samples: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=12))
    desired: int | None = None
    blocked: str | None = None
    late: bool = False


@dataclass(frozen=True)
class Demand:
    instances: float
    why: str


@dataclass(frozen=True)
class SizeRequest:
    """One cluster's sizing this cycle (what its reconciler knows)."""

    entry: Entry
    scaling: ScalingSpec
    declared: int
    workload: WorkloadRef
    pods: list[JsonDict]
    in_flight: Mapping[str, float]
    demand: Demand | None
    price_per_instance_hour: float | None
    labels: Mapping[str, str]
    """The metric labels: namespace, pd_cluster, prefill_cluster, role."""
    old: ScalingStatus | None
    fixed_cost_per_hour: float = 0.0


class ElasticScaler:
    def __init__(self, api: KubeApi, world: World, metrics: OperatorMetrics) -> None:
        self.api, self.world, self.metrics = api, world, metrics
        self.runtimes: dict[tuple[str, Any], ElasticRuntime] = {}

    def forget(self, kind: str, key: Any) -> None:
        self.runtimes.pop((kind, key), None)

    async def size(self, req: SizeRequest, now_s: float) -> ScalingStatus | None:
        """Decide and act; the status to write (None: the workload is unreadable, or Fixed mode)."""
        if req.scaling.mode == "Fixed":
            return None
        entry, ns = req.entry, req.entry.namespace or "default"
        scale = await self.api.get(workload_path(req.workload, ns, "scale"))
        if scale is None:
            return None
        replicas = int((scale.get("spec") or {}).get("replicas") or 0)
        live = [p for p in req.pods if not removed(p)]
        marked = [p for p in live if scale_in_mark(p) == DRAINING]
        serving = [p for p in live if scale_in_mark(p) != DRAINING]
        ready = sum(1 for p in serving if pod_ready(p))
        rt = self.runtimes.setdefault((entry.kind, entry.key), ElasticRuntime())
        target = replicas - len(marked)
        if rt.desired is None:
            rt.desired = req.old.desired_instances if req.old and req.old.desired_instances is not None else target
            rt.memory = seeded(rt.memory, now_s, rt.desired)
        s = req.scaling
        blocked: str | None = None
        if s.mode == "External":
            desired, reason = req.declared, f"External: spec.instances {req.declared} (written through /scale)"
        elif req.demand is None:
            desired, reason = rt.desired, "holding: no demand metrics this cycle"
        else:
            rt.samples.append((now_s, req.demand.instances))
            bounds = ScaleBounds(
                s.min_instances,
                s.max_instances,
                s.budget_per_hour,
                req.price_per_instance_hour,
                req.fixed_cost_per_hour,
            )
            behavior = ScaleBehavior(
                s.tolerance,
                s.scale_up_stabilization_seconds,
                s.scale_down_stabilization_seconds,
                s.scale_down_step,
                s.startup_seconds,
            )
            need = forecast(list(rt.samples), s.startup_seconds)
            d = decide_scale(now_s, rt.desired, need, bounds, behavior, rt.memory, ready, req.demand.why)
            rt.memory, desired, reason, blocked = d.memory, d.desired, d.reason, d.blocked
        last_scale = req.old.last_scale_time if req.old else None
        if desired != rt.desired:
            last_scale = iso(now_s)
        rt.desired = desired
        await self._act(req, ns, desired, replicas, marked, serving, now_s, reason)
        if blocked != rt.blocked and blocked is not None:
            await post_event(self.api, entry.body, "Warning", "ScaleOutBlocked", reason, now_s)
        rt.blocked = blocked
        pending = max(0, desired - ready)
        if pending:
            reason += f"; {pending} not ready yet"
        since = parse_iso(last_scale) if last_scale else None
        late = pending > 0 and since is not None and now_s - since > s.startup_seconds
        if late and not rt.late:  # pods Pending past an instance's start-up time: no GPU?
            message = (
                f"{pending} of {desired} instances not ready {s.startup_seconds}s after the last scale "
                "(Pending pods: no free GPUs?); desired and ready stay reported apart"
            )
            await post_event(self.api, entry.body, "Warning", "ScaleOutPending", message, now_s)
        rt.late = late
        labels = dict(req.labels)
        self.metrics.desired_instances.labels(**labels).set(desired)
        self.metrics.ready_instances.labels(**labels).set(ready)
        for why in ("max", "budget"):
            self.metrics.scaling_blocked.labels(**labels, reason=why).set(1 if blocked == why else 0)
        new = ScalingStatus(
            desired_instances=desired,
            ready_instances=ready,
            pending_instances=pending,
            blocked=blocked,  # type: ignore[arg-type]  # "max" | "budget" | None by construction
            reason=reason[:1024],
            last_scale_time=last_scale,
        )
        old = req.old
        if old is not None and (old.desired_instances, old.ready_instances, old.pending_instances, old.blocked) == (
            desired,
            ready,
            pending,
            blocked,
        ):
            return old  # nothing moved: the caller writes nothing new
        return new

    async def _act(
        self,
        req: SizeRequest,
        ns: str,
        desired: int,
        replicas: int,
        marked: list[JsonDict],
        serving: list[JsonDict],
        now_s: float,
        reason: str,
    ) -> None:
        target = replicas - len(marked)
        body = req.entry.body
        if desired > target and marked:  # demand came back: drains are called off before anything is added
            back = marked[: desired - target]
            for pod in back:
                await self._mark(ns, pod, None)
            marked, target = marked[len(back) :], target + len(back)
            if desired <= replicas:
                return
        if desired > replicas:
            await self._write_replicas(req, ns, desired)
            await post_event(self.api, body, "Normal", "ScaledOut", f"{replicas} -> {desired}: {reason}", now_s)
            return
        if desired < target:
            if req.workload.kind == "Deployment":  # it removes the lowest deletion cost: any pod, not-ready first
                order = sorted(serving, key=lambda p: (pod_ready(p), req.in_flight.get(name(p), 0.0)))
            else:  # a StatefulSet (LeaderWorkerSet) removes its highest ordinals, whatever is drained
                order = sorted(serving, key=lambda p: -_ordinal(p))
            chosen = order[: target - desired]
            for pod in chosen:
                await self._mark(ns, pod, now_s)
            names = ", ".join(name(p) for p in chosen)
            await post_event(self.api, body, "Normal", "ScaleInDraining", f"draining {names}: {reason}", now_s)
            return
        if marked and all(self._drained(req, p, now_s) for p in marked):
            await self._write_replicas(req, ns, replicas - len(marked))
            for pod in marked:
                await self._patch(ns, pod, {}, {ANNOTATION_SCALE_IN: REMOVED})
            message = f"{replicas} -> {replicas - len(marked)}: drained {', '.join(name(p) for p in marked)}"
            await post_event(self.api, body, "Normal", "ScaledIn", message, now_s)

    def _drained(self, req: SizeRequest, pod: JsonDict, now_s: float) -> bool:
        if not pod_ready(pod) or req.in_flight.get(name(pod), 0.0) <= 0:
            return True
        started = parse_iso(annotations_of(pod).get(ANNOTATION_DRAIN_STARTED))
        return started is None or now_s - started >= req.scaling.drain_timeout_seconds

    async def _write_replicas(self, req: SizeRequest, ns: str, n: int) -> None:
        await self.api.patch(workload_path(req.workload, ns, "scale"), {"spec": {"replicas": max(0, n)}})

    async def _mark(self, ns: str, pod: JsonDict, now_s: float | None) -> None:
        """Drain a pod for a scale-in (``now_s``), or call its drain off (None)."""
        if now_s is None:
            labels: dict[str, Any] = {LABEL_DRAINING: None}
            notes: dict[str, Any] = {ANNOTATION_SCALE_IN: None, ANNOTATION_DRAIN_STARTED: None}
            notes[ANNOTATION_POD_DELETION_COST] = None
        else:
            labels = {LABEL_DRAINING: "true"}
            notes = {ANNOTATION_SCALE_IN: DRAINING, ANNOTATION_DRAIN_STARTED: iso(now_s)}
            notes[ANNOTATION_POD_DELETION_COST] = "-1000"
        await self._patch(ns, pod, labels, notes)

    async def _patch(self, ns: str, pod: JsonDict, labels: dict[str, Any], notes: dict[str, Any]) -> None:
        meta: JsonDict = {}
        if labels:
            meta["labels"] = labels
        if notes:
            meta["annotations"] = notes
        patched = await self.api.patch(api_path("v1", "pods", ns, name(pod)), {"metadata": meta})
        if patched.get("metadata"):
            self.world.upsert_pod(patched)
