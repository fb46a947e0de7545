"""InterDCLink reconcile: measured egress and utilisation, scarce/abundant (the core's hysteresis), and the
bandwidth-feasible lower bound on ``t`` at the measured load.

The bound is the core's :func:`~prfaas_core.policy.threshold.bandwidth_floor_tokens`, at the lower bound the
PD cluster last published (the ``t`` the measured egress was produced under; :meth:`PDClusterReconciler.published`,
from the PD reconciler's memory, not from its status). The PD cluster computes the same bound itself from this
link's measured egress and state, so neither passes a derived value to the other through status.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from prfaas_core.api import InterDCLink, InterDCLinkStatus
from prfaas_core.capacity.plan_inputs import PlanInputs
from prfaas_core.names import KIND_INTER_DC_LINK, KIND_PD_CLUSTER, KIND_PREFILL_CLUSTER
from prfaas_core.policy.link_state import LinkMode, LinkParams, LinkState, next_link_state
from prfaas_core.policy.threshold import bandwidth_floor_tokens

from .fleet import link_condition
from .kube import KubeApi
from .logs import logger
from .metrics import OperatorMetrics
from .observe import LinkQuery, Snapshot
from .registry import Entry, World
from .status import changed_reason, get_condition, iso, post_event, set_condition
from .writer import StatusWriter

MODES: dict[str, LinkMode] = {"Scarce": "scarce", "Abundant": "abundant"}


@dataclass(frozen=True)
class Published:
    """What a PD cluster's loop last published that its links need: its plan inputs and its lower bound on t."""

    inputs: PlanInputs
    threshold_min_tokens: int | None


def link_params(link: InterDCLink) -> LinkParams:
    s = link.spec
    return LinkParams(link.metadata.name, s.capacity_gbps, s.max_utilization, s.scarce_watermark, s.abundant_watermark)


class LinkReconciler:
    def __init__(
        self,
        api: KubeApi,
        world: World,
        writer: StatusWriter,
        metrics: OperatorMetrics,
        default_prometheus_url: str,
        published: Callable[[tuple[str | None, str]], Published | None],
    ) -> None:
        self.api = api
        self.world = world
        self.writer = writer
        self.metrics = metrics
        self.default_prometheus_url = default_prometheus_url
        self.published = published
        self.next_due: dict[tuple[str | None, str], float] = {}

    def query(self, entry: Entry) -> LinkQuery:
        pd = self.world.get(KIND_PD_CLUSTER, entry.namespace, entry.model.spec.pd_cluster_ref.name)
        url = (pd.model.spec.prometheus.url if pd is not None and pd.valid else None) or self.default_prometheus_url
        return LinkQuery((entry.namespace or "", entry.name), url, entry.model.spec.measurement)

    async def reconcile(self, entry: Entry, snap: Snapshot | None, now_s: float, measure: bool) -> None:
        with self.metrics.reconcile_timer(KIND_INTER_DC_LINK):
            await self._reconcile(entry, snap, now_s, measure)

    async def _reconcile(self, entry: Entry, snap: Snapshot | None, now_s: float, measure: bool) -> None:
        log = logger(KIND_INTER_DC_LINK, entry.namespace, entry.name)
        gen = entry.generation
        old = entry.read_status(InterDCLinkStatus)
        conds = old.conditions
        if entry.paused:
            await self.writer.write_paused(entry, InterDCLinkStatus, conds, now_s)
            return
        problem = self.problem(entry)
        if problem is not None:
            reason, message = problem
            ready = get_condition(conds, "Ready")
            conds = set_condition(conds, "Ready", False, reason, message, now_s, gen)
            await self.writer.write(entry, InterDCLinkStatus(observed_generation=gen, conditions=conds))
            if changed_reason(ready, reason, message):
                log.warning("not ready", reason=reason, message=message)
                await post_event(self.api, entry.body, "Warning", reason, message, now_s)
            return
        conds = set_condition(conds, "Ready", True, "Reconciled", "references resolved", now_s, gen)
        link: InterDCLink = entry.model
        site = self.world.get(KIND_PREFILL_CLUSTER, entry.namespace, link.spec.prefill_cluster_ref.name)
        conds, drain_event = link_condition(conds, link, site.model if site and site.valid else None, now_s, gen)
        if drain_event is not None:
            log.info("link drain changed", reason=drain_event[0], message=drain_event[1])
            await post_event(self.api, entry.body, "Normal", *drain_event, now_s)
        if not measure or snap is None:
            await self.writer.write(entry, InterDCLinkStatus(observed_generation=gen, conditions=conds))
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
            await self.writer.write(entry, InterDCLinkStatus(observed_generation=gen, conditions=conds))
            return
        params = link_params(link)
        prev = LinkState(MODES.get(old.state, "abundant"), 0.0, now_s)
        state = next_link_state(prev, egress, params, now_s)
        published = self.published((entry.namespace, link.spec.pd_cluster_ref.name))
        floor: int | None = None
        if published is not None:
            t = float(published.threshold_min_tokens or 0)
            floor = bandwidth_floor_tokens(published.inputs, t, egress, params, state.mode)
        utilization = egress / link.spec.capacity_gbps
        new_state: Literal["Scarce", "Abundant"] = "Scarce" if state.scarce else "Abundant"
        conds = set_condition(conds, "Degraded", False, "Measured", "egress measured this cycle", now_s, gen)
        status = InterDCLinkStatus(
            observed_generation=gen,
            measured_egress_gbps=round(egress, 4),
            utilization=round(utilization, 4),
            utilization_percent=f"{utilization:.0%}",
            state=new_state,
            threshold_floor_tokens=floor,
            last_measured_time=iso(now_s),
            conditions=conds,
        )
        await self.writer.write(entry, status)
        if new_state != old.state and old.state != "Unknown":
            log.info("link state changed", state=new_state, reason=state.reason)
            await post_event(self.api, entry.body, "Normal", f"Link{new_state}", state.reason, now_s)

    def problem(self, entry: Entry) -> tuple[str, str] | None:
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
