"""InterDCLink reconcile: measured egress and utilisation, scarce/abundant (the core's hysteresis), and the
bandwidth-feasible lower bound on ``t`` at the measured load.

The bound (paper-spec §2.4): the arrival rate is recovered from the measured egress and the ``t`` in force
(``Λ = egress / E[S_kv(L)·1{L > t}]``), then ``t_bw`` is the smallest ``t`` whose egress at that rate fits the
budget — the scarce watermark while abundant, the abundant watermark while scarce (the core's
:func:`~prfaas_core.policy.threshold.decide_threshold` uses the same budgets).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from prfaas_core.api import InterDCLink
from prfaas_core.names import GBPS_BITS, KIND_INTER_DC_LINK, KIND_PD_CLUSTER, KIND_PREFILL_CLUSTER
from prfaas_core.plan_inputs import PlanInputs
from prfaas_core.policy.link import LinkParams, LinkState, next_link_state
from prfaas_core.throughput import egress_floor_threshold
from prfaas_core.workload import expect

from .kube import JsonDict, KubeApi
from .logs import logger
from .metrics import OperatorMetrics
from .observe import LinkQuery, Snapshot
from .registry import Entry, World
from .status import get_condition, iso, post_event, set_condition
from .writer import StatusWriter

STATES = {"Scarce": "scarce", "Abundant": "abundant"}


def link_params(link: InterDCLink) -> LinkParams:
    s = link.spec
    return LinkParams(link.metadata.name, s.capacity_gbps, s.max_utilization, s.scarce_watermark, s.abundant_watermark)


def floor_tokens(
    inputs: PlanInputs, threshold_tokens: float, egress_gbps: float, params: LinkParams, scarce: bool
) -> int:
    """``t_bw`` at the arrival rate implied by the measured egress (see the module docstring)."""
    if egress_gbps <= 0:
        return 0
    per_request = expect(inputs.lengths, inputs.kv.curve, threshold_tokens, math.inf)
    if per_request <= 0:
        return 0
    rate = egress_gbps * GBPS_BITS / 8.0 / per_request
    budget = params.cap_gbps * (params.abundant_watermark if scarce else params.scarce_watermark)
    return egress_floor_threshold(inputs.lengths, inputs.kv, rate, budget)


class LinkReconciler:
    def __init__(
        self,
        api: KubeApi,
        world: World,
        writer: StatusWriter,
        metrics: OperatorMetrics,
        default_prometheus_url: str,
        inputs_for: Callable[[tuple[str | None, str]], PlanInputs | None],
    ) -> None:
        self.api = api
        self.world = world
        self.writer = writer
        self.metrics = metrics
        self.default_prometheus_url = default_prometheus_url
        self.inputs_for = inputs_for
        self.next_due: dict[tuple[str | None, str], float] = {}

    def query(self, entry: Entry) -> LinkQuery:
        pd = self.world.get(KIND_PD_CLUSTER, entry.namespace, entry.model.spec.pd_cluster_ref.name)
        url = (pd.model.spec.prometheus.url if pd is not None and pd.valid else None) or self.default_prometheus_url
        return LinkQuery((entry.namespace or "", entry.name), url, entry.model.spec.measurement)

    async def reconcile(self, entry: Entry, snap: Snapshot | None, now_s: float, measure: bool) -> None:
        started = time.perf_counter()
        try:
            await self._reconcile(entry, snap, now_s, measure)
        finally:
            self.metrics.reconcile_seconds.labels(kind=KIND_INTER_DC_LINK).observe(time.perf_counter() - started)

    async def _reconcile(self, entry: Entry, snap: Snapshot | None, now_s: float, measure: bool) -> None:
        log = logger(KIND_INTER_DC_LINK, entry.namespace, entry.name)
        gen = entry.generation
        conds: list[JsonDict] = list(entry.status.get("conditions") or [])
        if entry.paused:
            conds = set_condition(conds, "Paused", True, "PausedByAnnotation", "reconciliation is paused", now_s, gen)
            await self.writer.write(entry, {"conditions": conds})
            return
        problem = self._problem(entry)
        if problem is not None:
            reason, message = problem
            old = get_condition(conds, "Ready") or {}
            conds = set_condition(conds, "Ready", False, reason, message, now_s, gen)
            await self.writer.write(entry, {"observedGeneration": gen, "conditions": conds})
            if old.get("reason") != reason or old.get("message") != message:
                log.warning("not ready", reason=reason, message=message)
                await post_event(self.api, entry.body, "Warning", reason, message, now_s)
            return
        conds = set_condition(conds, "Ready", True, "Reconciled", "references resolved", now_s, gen)
        link: InterDCLink = entry.model
        if not measure or snap is None:
            await self.writer.write(entry, {"observedGeneration": gen, "conditions": conds})
            return
        q = self.query(entry)
        egress = snap.link_egress_gbps.get(q.key)
        if egress is None:
            why = (
                snap.errors.get(q.url)
                or f"no egress series for link {entry.name} ({link.spec.measurement.egress_query})"
            )
            self.metrics.prometheus_errors.labels(reason="LinkNoData").inc()
            conds = set_condition(conds, "Degraded", True, "NoMeasurement", why, now_s, gen)
            await self.writer.write(entry, {"observedGeneration": gen, "conditions": conds})
            return
        params = link_params(link)
        old_state = str(entry.status.get("state") or "Unknown")
        prev = LinkState(STATES.get(old_state, "abundant"), 0.0, now_s)  # type: ignore[arg-type]
        state = next_link_state(prev, egress, params, now_s)
        inputs = self.inputs_for((entry.namespace, link.spec.pd_cluster_ref.name))
        floor: int | None = None
        if inputs is not None:
            pd = self.world.get(KIND_PD_CLUSTER, entry.namespace, link.spec.pd_cluster_ref.name)
            t = (pd.status.get("thresholdMinTokens") if pd is not None else None) or 0
            floor = floor_tokens(inputs, float(t), egress, params, state.scarce)
        utilization = egress / link.spec.capacity_gbps
        new_state = "Scarce" if state.scarce else "Abundant"
        conds = set_condition(conds, "Degraded", False, "Measured", "egress measured this cycle", now_s, gen)
        status: dict[str, Any] = {
            "observedGeneration": gen,
            "measuredEgressGbps": round(egress, 4),
            "utilization": round(utilization, 4),
            "utilizationPercent": f"{utilization:.0%}",
            "state": new_state,
            "thresholdFloorTokens": floor,
            "lastMeasuredTime": iso(now_s),
            "conditions": conds,
        }
        await self.writer.write(entry, status)
        if new_state != old_state and old_state != "Unknown":
            log.info("link state changed", state=new_state, reason=state.reason)
            await post_event(self.api, entry.body, "Normal", f"Link{new_state}", state.reason, now_s)

    def _problem(self, entry: Entry) -> tuple[str, str] | None:
        if not entry.valid:
            return "InvalidSpec", "; ".join(entry.problems)
        spec = entry.model.spec
        for kind, ref, field in (
            (KIND_PREFILL_CLUSTER, spec.prefill_cluster_ref.name, "prefillClusterRef"),
            (KIND_PD_CLUSTER, spec.pd_cluster_ref.name, "pdClusterRef"),
        ):
            target = self.world.get(kind, entry.namespace, ref)
            if target is None:
                return "DanglingReference", f"spec.{field}: {kind} {ref!r} not found in namespace {entry.namespace}"
        return None
