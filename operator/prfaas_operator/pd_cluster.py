"""PDCluster reconcile: validate, resolve references, then one long-term cycle in four named steps —
*gather* the core's :class:`~prfaas_core.policy.long_term.LoopTick` (pods, metrics, the state persisted in status
and on the pods, the links measured scarce), *decide* (the core's :func:`~prfaas_core.policy.long_term.step`),
*carry out* its effects (assign, drain, flip), *report* (publish the router config with the decision's
bounds, write the status composed from the decision, metrics, Event, log).

The operator decides nothing here: role counts, ``t_min``, the ``t`` in force and its bounds, the desired
counts, the dry-run and override handling and the history are the core's. Level-based: the loop's state is
rebuilt every cycle from the cluster (:func:`.pods.restore_state`); only the persistence streak lives in
memory, and in ``status.loop`` across restarts.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from prfaas_core.api import (
    Condition,
    InterDCLinkStatus,
    PDCluster,
    PDClusterStatus,
    PrefillClusterStatus,
    RouterConfig,
)
from prfaas_core.capacity.plan_inputs import PlanInputError, PlanInputs, plan_inputs_from_specs
from prfaas_core.capacity.planner import BalancedThresholds
from prfaas_core.capacity.workload import WorkloadSpec
from prfaas_core.names import ANNOTATION_PAUSED, KIND_PD_CLUSTER, LABEL_PD_CLUSTER
from prfaas_core.policy.long_term import LoopDecision, LoopTick, ScarceLink, step
from prfaas_core.policy.role_types import RoleObservation, RolePolicyParams, Verdict

from . import pods as podlib
from . import router_config
from .actuate import KubeActuator
from .elastic import ElasticScaler, SizeRequest, scale_in_mark
from .elastic_demand import pd_load_demand
from .engine_config import CONDITION as ENGINE_CONFIG
from .engine_config import engine_config
from .kube import ApiError, JsonDict, KubeApi
from .link import Published, link_params
from .logs import logger
from .metrics import OperatorMetrics, reason_kind
from .observe import ClusterQuery, Snapshot
from .pd_refs import LinkIndex, Refs, resolve
from .pd_status import Observed, compose
from .registry import Entry, Key, World
from .status import changed_reason, condition_true, get_condition, post_event, set_condition
from .writer import StatusWriter


@dataclass
class PDRuntime:
    """What one PD cluster keeps in memory between cycles (nothing that a restart must not lose)."""

    verdict: Verdict | None = None
    streak: int = 0
    last_run_s: float | None = None
    next_due_s: float = 0.0
    polling: bool = False  # next_due_s is a drain poll (or a retry), not a period away
    inputs: PlanInputs | None = None
    inputs_from: tuple[Any, ...] = ()
    published_min_tokens: int | None = None
    """The lower bound on ``t`` last published (what the links' floors are computed at)."""
    thresholds: BalancedThresholds = field(default_factory=BalancedThresholds)
    """Eq. 7's last answers for this cluster's inputs, handed to the core's tick: at rest they are the same every
    cycle (a few milliseconds a call, a few calls a cycle). Dropped with the cluster."""


@dataclass(frozen=True)
class PDCycle:
    """One cycle's context: the cluster, what it refers to, this tick's snapshot and clock, its status as read
    at the start, the policy, its pods before the effects."""

    entry: Entry
    refs: Refs
    inputs: PlanInputs
    snap: Snapshot | None
    status: PDClusterStatus
    params: RolePolicyParams
    pods: list[JsonDict]
    now_s: float
    log: Any


class PDClusterReconciler:
    def __init__(
        self,
        api: KubeApi,
        world: World,
        writer: StatusWriter,
        actuator: KubeActuator,
        publisher: router_config.RouterConfigPublisher,
        metrics: OperatorMetrics,
        default_prometheus_url: str,
    ) -> None:
        self.api = api
        self.world = world
        self.writer = writer
        self.actuator = actuator
        self.publisher = publisher
        self.metrics = metrics
        self.default_prometheus_url = default_prometheus_url
        self.runtimes: dict[Key, PDRuntime] = {}
        self.links = LinkIndex(world)
        self.scaler = ElasticScaler(api, world, metrics)

    # --- scheduling -----------------------------------------------------------------------------------
    def runtime(self, entry: Entry) -> PDRuntime:
        key = entry.key
        rt = self.runtimes.get(key)
        if rt is None:  # (not setdefault: that built a runtime, memo included, per call, for every cluster every tick)
            rt = self.runtimes[key] = PDRuntime()
        return rt

    def forget(self, key: Key) -> None:
        self.runtimes.pop(key, None)

    def prometheus_url(self, entry: Entry) -> str:
        return (entry.model.spec.prometheus.url if entry.valid else None) or self.default_prometheus_url

    def query(self, entry: Entry) -> ClusterQuery:
        return ClusterQuery((entry.namespace or "", entry.name), self.prometheus_url(entry), entry.model.spec)

    def due(self, entry: Entry, now_s: float, slack: float = 0.0) -> bool:
        """Whether its loop is due by ``now_s``, or (a period run, not a drain poll) within ``slack`` of its
        period after it: a cycle runs anyway, and running a little early brings it into step with the others."""
        if not entry.valid or entry.paused:
            return False
        rt = self.runtime(entry)
        ahead = 0.0 if rt.polling else slack * entry.model.spec.policy.period_seconds
        return rt.next_due_s <= now_s + ahead

    def due_at(self, entry: Entry) -> float | None:
        """When its loop is next due (without slack: :meth:`due` at that time); None while it runs no loop."""
        return None if not entry.valid or entry.paused else self.runtime(entry).next_due_s

    def period_run(self, entry: Entry) -> bool:
        """Whether its next run is a period's (not a drain poll's): only those pull others into step."""
        return not self.runtime(entry).polling

    def published(self, key: Key) -> Published | None:
        """What its links need from the loop: the plan inputs and the lower bound on ``t`` last published
        (None until this operator has reconciled it)."""
        rt = self.runtimes.get(key)
        if rt is None or rt.inputs is None:
            return None
        return Published(rt.inputs, rt.published_min_tokens)

    def _inputs(self, entry: Entry, refs: Refs) -> PlanInputs:
        rt = self.runtime(entry)
        link = refs.links[0]
        pfc = refs.prefill_clusters[link.spec.prefill_cluster_ref.name]
        source = (refs.profile, pfc, entry.model, link)
        if (
            rt.inputs is None
            or len(rt.inputs_from) != 4
            or any(a is not b for a, b in zip(rt.inputs_from, source, strict=True))
        ):
            rt.inputs = plan_inputs_from_specs(refs.profile.spec, pfc.spec, entry.model.spec, link.spec, WorkloadSpec())
            rt.inputs_from = source
        return rt.inputs

    # --- the reconcile ------------------------------------------------------------------------------
    async def reconcile(self, entry: Entry, snap: Snapshot | None, now_s: float, run_loop: bool) -> None:
        with self.metrics.reconcile_timer(KIND_PD_CLUSTER):
            await self._reconcile(entry, snap, now_s, run_loop)

    async def _reconcile(self, entry: Entry, snap: Snapshot | None, now_s: float, run_loop: bool) -> None:
        log = logger(KIND_PD_CLUSTER, entry.namespace, entry.name)
        gen = entry.generation
        status = entry.read_status(PDClusterStatus)
        conds = status.conditions
        if entry.paused:
            message = f"{ANNOTATION_PAUSED}=true: reconciliation is paused; nothing is observed or acted on"
            if await self.writer.write_paused(entry, PDClusterStatus, conds, now_s, message):
                log.info("paused", annotation=ANNOTATION_PAUSED)
            return
        if condition_true(conds, "Paused"):
            conds = set_condition(conds, "Paused", False, "Resumed", "reconciliation resumed", now_s, gen)
        if not entry.valid:
            await self._not_ready(entry, conds, "InvalidSpec", "; ".join(entry.problems), now_s, log)
            return
        refs, reason, message = resolve(self.world, self.links, entry)
        if refs is None:
            await self._not_ready(entry, conds, reason, message, now_s, log)
            return
        try:
            inputs = self._inputs(entry, refs)
        except (PlanInputError, ValueError) as exc:
            await self._not_ready(entry, conds, "PlanInputsInvalid", str(exc), now_s, log)
            return
        rt = self.runtime(entry)
        if rt.published_min_tokens is None:
            rt.published_min_tokens = status.threshold_min_tokens
        if rt.verdict is None and rt.streak == 0 and status.loop is not None:
            # a restarted operator: the persistence streak comes back from status, not memory
            rt.verdict, rt.streak = status.loop.verdict, status.loop.streak
        if entry.model.spec.role_assignment.mode == "Scale":
            await self._resume_flips(entry, log)
        if run_loop:
            await self._size(entry, snap, now_s, log)
            await self._cycle(entry, refs, inputs, snap, status, conds, now_s, log)

    async def _size(self, entry: Entry, snap: Snapshot | None, now_s: float, log: Any) -> None:
        """Elastic capacity (:mod:`.elastic`): the total sized on the shared workload; the role loop then splits
        whatever instances there are. ``status.replicas``/``selector`` (the ``/scale`` view) always."""
        pd: PDCluster = entry.model
        every = self.world.pods_of(entry.namespace, LABEL_PD_CLUSTER, entry.name)
        serving = [p for p in every if not podlib.retired(p) and scale_in_mark(p) is None]
        fields: dict[str, Any] = {
            "replicas": sum(1 for p in serving if podlib.pod_ready(p)),
            "selector": f"{LABEL_PD_CLUSTER}={entry.name}",
        }
        shared = pd.spec.workloads.shared
        if pd.spec.scaling.mode != "Fixed" and shared is not None:
            ns = entry.namespace or ""
            metrics = snap.clusters.get((ns, entry.name)) if snap is not None else None
            req = SizeRequest(
                entry=entry,
                scaling=pd.spec.scaling,
                declared=pd.spec.instances,
                workload=shared,
                pods=[p for p in every if not podlib.retired(p)],
                in_flight=metrics.in_flight if metrics is not None else {},
                demand=pd_load_demand(entry, pd, snap, self.prometheus_url(entry)),
                price_per_instance_hour=pd.spec.hardware.price_per_instance_hour,
                labels={"namespace": ns or "default", "pd_cluster": entry.name, "prefill_cluster": "", "role": "all"},
                old=entry.read_status(PDClusterStatus).scaling,
            )
            try:
                fields["scaling"] = await self.scaler.size(req, now_s)
            except ApiError as exc:
                log.error("scaling not carried out", error=str(exc))
        if pd.spec.scaling.mode == "Fixed":
            fields["scaling"] = None  # back to Fixed: the old sizing goes (absent already: no write)
        elif fields.get("scaling") is None:
            fields.pop("scaling", None)  # unreadable this cycle: the last sizing stays
        await self.writer.write(entry, PDClusterStatus(**fields))

    async def _resume_flips(self, entry: Entry, log: Any) -> None:
        """A Scale-mode flip interrupted after the retirement: write its replica counts now (idempotent)."""
        pods = self.world.pods_of(entry.namespace, LABEL_PD_CLUSTER, entry.name)
        try:
            resumed = await self.actuator.resume(entry.namespace or "default", pods)
        except ApiError as exc:
            log.error("interrupted flip not resumed yet", error=str(exc))
            return
        if resumed:
            log.info("interrupted flip resumed", pods=resumed)

    async def _not_ready(
        self, entry: Entry, conds: list[Condition], reason: str, message: str, now_s: float, log: Any
    ) -> None:
        old = get_condition(conds, "Ready")
        conds = set_condition(conds, "Ready", False, reason, message, now_s, entry.generation)
        await self.writer.write(entry, PDClusterStatus(observed_generation=entry.generation, conditions=conds))
        if changed_reason(old, reason, message):
            log.warning("not ready", reason=reason, message=message)
            await post_event(self.api, entry.body, "Warning", reason, message, now_s)

    async def _cycle(
        self,
        entry: Entry,
        refs: Refs,
        inputs: PlanInputs,
        snap: Snapshot | None,
        status: PDClusterStatus,
        conds: list[Condition],
        now_s: float,
        log: Any,
    ) -> None:
        """One long-term cycle: gather, decide, carry out, report."""
        params = RolePolicyParams.from_spec(entry.model.spec)
        gen = entry.generation
        conds = set_condition(conds, "Ready", True, "Reconciled", "spec valid and references resolved", now_s, gen)
        pods = self._pods(entry)
        engines = engine_config(entry.model, refs.profile, pods, refs.links, refs.prefill_clusters)
        conds = set_condition(conds, ENGINE_CONFIG, engines.status, engines.reason, engines.message, now_s, gen)
        c = PDCycle(entry, refs, inputs, snap, status, params, pods, now_s, log)
        tick, why = self._gather(c)
        # the core's step runs here: at rest it is a fraction of a millisecond (Eq. 7 answered from the cluster's
        # memo), less than handing it to a thread and back costs (each hand-off woke the event loop through its
        # self-pipe and contended for the GIL: more of the operator's time than the step). First roles search the
        # planner's splits (long): those still run in a thread, so that the event loop stays free.
        decision = await asyncio.to_thread(step, tick) if tick.unassigned else step(tick)
        rt = self.runtime(entry)
        if decision.roles is None:
            await self._hold(c, decision, conds, why or "")
        elif not await self._carry_out(c, decision, conds):
            rt.next_due_s, rt.polling = decision.retry_s(params), True
            return
        else:
            await self._report(c, decision, conds)
        rt.verdict, rt.streak = decision.state.roles.verdict, decision.state.roles.streak
        rt.last_run_s = decision.state.last_run_s
        rt.next_due_s, rt.polling = decision.next_due_s, decision.polling
        rt.published_min_tokens = decision.published_min_tokens

    def _pods(self, entry: Entry) -> list[JsonDict]:
        """Its live pods, less those retired by a Scale-mode flip or drained for a scale-in."""
        pods = self.world.pods_of(entry.namespace, LABEL_PD_CLUSTER, entry.name)
        return [p for p in pods if not podlib.retired(p) and scale_in_mark(p) is None]

    def _gather(self, c: PDCycle) -> tuple[LoopTick, str | None]:
        """The tick's input, and why there is no observation (when there is none)."""
        pd: PDCluster = c.entry.model
        rt = self.runtime(c.entry)
        # every pod, the retired too: a flip whose decision never reached the status (interrupted, then resumed)
        # still starts the cooldown through its pod's last-flip stamp
        every = self.world.pods_of(c.entry.namespace, LABEL_PD_CLUSTER, c.entry.name)
        every = [p for p in every if scale_in_mark(p) is None]  # a scale-in's drain is no flip
        state = podlib.restore_state(every, c.status, rt.verdict, rt.streak, rt.last_run_s, c.now_s)
        unassigned = podlib.unassigned(c.pods) if pd.spec.role_assignment.mode == "Relabel" else ()
        why: str | None = None
        if unassigned:  # first roles need no metrics: the instances serve nothing yet
            obs: RoleObservation | None = RoleObservation(podlib.instances(c.pods))
        else:
            ns = c.entry.namespace or "default"
            metrics, why = (
                (None, "no Prometheus snapshot this cycle")
                if c.snap is None
                else c.snap.for_cluster((ns, c.entry.name), self.prometheus_url(c.entry))
            )
            prefill_status = [e.read_status(PrefillClusterStatus) for e in c.refs.prefill_entries.values()]
            obs = None if metrics is None else podlib.observation(c.pods, metrics, prefill_status)
        scarce = []
        for link in c.refs.link_entries:
            st = link.read_status(InterDCLinkStatus)
            if st.state == "Scarce" and st.measured_egress_gbps is not None:
                scarce.append(ScarceLink(link_params(link.model), st.measured_egress_gbps))
        tick = LoopTick(
            c.now_s,
            c.params,
            c.inputs,
            state,
            obs,
            unassigned=unassigned,
            initial_prefill=pd.spec.role_assignment.initial_prefill,
            scarce_links=tuple(scarce),
            history_limit=pd.spec.policy.history_limit,
            thresholds=rt.thresholds,
        )
        return tick, why

    async def _carry_out(self, c: PDCycle, decision: LoopDecision, conds: list[Condition]) -> bool:
        """The decision's effects on the pods and workloads; False (and Degraded) when the API refused them."""
        if not decision.act or decision.roles is None:
            return True
        if decision.assign:
            await self.actuator.assign(c.entry.namespace or "default", decision.assign)
            return True
        try:
            await self.actuator.apply(c.entry.model, decision.roles, c.now_s)
        except ApiError as exc:
            action, gen = decision.roles.action, c.entry.generation
            conds = set_condition(conds, "Degraded", True, "ActuationFailed", f"{action}: {exc}", c.now_s, gen)
            await self.writer.write(c.entry, PDClusterStatus(conditions=conds))
            c.log.error("actuation failed", action=action, error=str(exc))
            return False
        return True

    async def _hold(self, c: PDCycle, decision: LoopDecision, conds: list[Condition], why: str) -> None:
        """No observation this cycle: Degraded with the reason, the last bounds published again, no decision."""
        kind = "PrometheusUnavailable" if "failed" in why else "PrometheusNoData"
        self.metrics.prometheus_errors.labels(reason=kind).inc()
        message = f"{why}; holding the last decision, no flips until metrics return"
        gen = c.entry.generation
        conds = set_condition(conds, "Degraded", True, kind, message, c.now_s, gen)
        if await self.writer.write(c.entry, PDClusterStatus(observed_generation=gen, conditions=conds)):
            c.log.warning("holding: no metrics", reason=kind, message=why)
        await self._publish(c, c.pods, decision)

    async def _publish(self, c: PDCycle, pods: list[JsonDict], decision: LoopDecision) -> str | None:
        """The routers' config with the decision's bounds on ``t``; None when the write failed (logged)."""
        refs = c.refs
        # built from the cache's frozen models and pod bodies (replaced on change, never edited) and the bounds
        built_from = router_config.BuiltFrom(
            (c.entry.model, refs.profile, *refs.links, *refs.prefill_clusters.values(), *pods),
            (decision.bounds, len(refs.links), tuple(refs.prefill_clusters), len(pods)),
        )

        def build() -> RouterConfig:
            return router_config.build(
                c.entry.model, pods, refs.profile.spec, refs.links, refs.prefill_clusters, decision.bounds
            )

        try:
            return await self.publisher.publish_built(c.entry.body, built_from, build)
        except ApiError as exc:
            c.log.error("router config not published", error=str(exc))
            return None

    async def _report(self, c: PDCycle, decision: LoopDecision, conds: list[Condition]) -> None:
        """Publish, write the status, count, announce and log a cycle that decided something."""
        assert decision.roles is not None and decision.record is not None
        entry, d, reason = c.entry, decision.roles, decision.record.reason
        pods = self._pods(entry)  # after the effects
        cm = await self._publish(c, pods, decision)
        scaled = await self.actuator.scale_counts(entry.model)  # Scale mode: the workloads' replicas (two GETs)
        utilization = c.refs.link_entries[0].read_status(InterDCLinkStatus).utilization_percent
        observed = Observed(pods, scaled, cm, utilization)
        await self.writer.write(entry, compose(decision, c.params, observed, conds, c.now_s, entry.generation))
        ns, kind = entry.namespace or "default", reason_kind(reason)
        self.metrics.decisions.labels(action=d.action, reason_kind=kind, namespace=ns, pd_cluster=entry.name).inc()
        for role in podlib.ROLES:
            self.metrics.role_instances.labels(namespace=ns, pd_cluster=entry.name, role=role).set(
                podlib.counts(pods, role)[0]
            )
        if decision.announce:
            await post_event(self.api, entry.body, "Normal", d.action, reason, c.now_s)
        acted = d.action not in ("Hold", "Suspended")
        (c.log.info if acted else c.log.debug)(
            "decision",
            action=d.action,
            reason=reason,
            reason_kind=kind,
            prefill=f"{d.prefill_from}->{d.prefill_to}",
            decode=f"{d.decode_from}->{d.decode_to}",
            threshold_tokens=decision.threshold_tokens,
            dry_run=c.params.dry_run,
        )


__all__ = ["PDClusterReconciler", "PDRuntime"]
