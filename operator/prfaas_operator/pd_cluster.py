"""PDCluster reconcile: validate, resolve references, run the core's long-term loop, actuate, publish, report.

Level-based: every run rebuilds the loop's state from the cluster — the pending drain from the pods'
``prfaas.io/draining`` label and ``drain-started`` annotation, the last flip from ``last-role-flip`` and the
decision history in status, ``t_min`` from status — so a restarted operator resumes a drain and keeps the
cooldown instead of flipping again. Only the persistence streak lives in memory (losing it on a restart
can delay a flip by the persistence window; it can never cause one).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any

from prfaas_core.api import InterDCLink, ModelProfile, PDCluster, PrefillCluster
from prfaas_core.names import (
    ANNOTATION_DRAIN_STARTED,
    ANNOTATION_LAST_FLIP,
    ANNOTATION_PAUSED,
    KIND_INTER_DC_LINK,
    KIND_MODEL_PROFILE,
    KIND_PD_CLUSTER,
    KIND_PREFILL_CLUSTER,
    LABEL_DRAINING,
    LABEL_PD_CLUSTER,
    LABEL_ROLE,
)
from prfaas_core.plan_inputs import PlanInputError, PlanInputs, plan_inputs_from_specs
from prfaas_core.planner import compute_balanced_threshold, plan
from prfaas_core.policy.loop import LongTermLoop
from prfaas_core.policy.roles import (
    InstanceState,
    PendingFlip,
    Role,
    RoleDecision,
    RoleObservation,
    RolePolicyParams,
    RoleState,
    StageLoad,
    Verdict,
)
from prfaas_core.workload import WorkloadSpec

from . import router_config
from .actuate import KubeActuator
from .kube import ApiError, JsonDict, KubeApi
from .logs import logger
from .metrics import OperatorMetrics, reason_kind
from .observe import ClusterMetrics, ClusterQuery, Snapshot
from .registry import Entry, World
from .status import (
    append_history,
    decision_record,
    format_tokens,
    get_condition,
    iso,
    parse_iso,
    post_event,
    set_condition,
    status_changed,
)
from .writer import StatusWriter

DRY_RUN_PREFIX = "dry-run, not acted on: "


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


@dataclass
class _Fixed:
    """The loop's Observer (this cycle's observation) and Actuator (recorded; applied async after)."""

    obs: RoleObservation
    applied: list[RoleDecision] = field(default_factory=list)

    def observe(self, now_s: float) -> RoleObservation:
        return self.obs

    def apply(self, decision: RoleDecision, now_s: float) -> None:
        self.applied.append(decision)


@dataclass(frozen=True)
class Refs:
    profile: ModelProfile
    links: list[InterDCLink]
    prefill_clusters: dict[str, PrefillCluster]
    prefill_entries: dict[str, Entry]


def _labels(pod: JsonDict) -> dict[str, str]:
    return pod.get("metadata", {}).get("labels") or {}


def _annotations(pod: JsonDict) -> dict[str, str]:
    return pod.get("metadata", {}).get("annotations") or {}


def retired(pod: JsonDict) -> bool:
    """Scale mode: a drained pod whose flip was carried out waits for its workload to remove it."""
    if _labels(pod).get(LABEL_DRAINING) != "true":
        return False
    flipped = parse_iso(_annotations(pod).get(ANNOTATION_LAST_FLIP))
    started = parse_iso(_annotations(pod).get(ANNOTATION_DRAIN_STARTED))
    return flipped is not None and (started is None or flipped >= started)


def pod_ready(pod: JsonDict) -> bool:
    status = pod.get("status") or {}
    ready = get_condition(status.get("conditions") or [], "Ready")
    return ready.get("status") == "True" if ready else status.get("phase") == "Running"


def restore_state(
    pods: list[JsonDict], status: JsonDict, verdict: Verdict | None, streak: int, now_s: float
) -> RoleState:
    """The loop's memory, rebuilt from the cluster (see the module docstring)."""
    flips = [parse_iso(_annotations(p).get(ANNOTATION_LAST_FLIP)) for p in pods]
    flips += [
        parse_iso(d.get("time")) for d in status.get("decisions") or [] if str(d.get("action", "")).startswith("Flip")
    ]
    known = [f for f in flips if f is not None]
    last_flip = max(known) if known else None
    draining = [p for p in pods if _labels(p).get(LABEL_DRAINING) == "true" and not retired(p)]
    pending = None
    roles = {_labels(p).get(LABEL_ROLE) for p in draining}
    if draining and len(roles) == 1 and roles <= {"prefill", "decode"}:
        started = [parse_iso(_annotations(p).get(ANNOTATION_DRAIN_STARTED)) for p in draining]
        known_started = [s for s in started if s is not None]
        last = status.get("lastDecision") or {}
        reason = str(last.get("reason", "")) if last.get("action") == "Drain" else ""
        reason = reason.split(": draining")[0] or "resumed drain"
        pending = PendingFlip(
            "FlipToDecode" if roles == {"prefill"} else "FlipToPrefill",
            tuple(str(p["metadata"]["name"]) for p in draining),
            min(known_started) if known_started else now_s,
            reason,
        )
    t_min = status.get("thresholdMinTokens")
    return RoleState(verdict, streak, last_flip, pending, int(t_min) if isinstance(t_min, int) else None)


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
        self.runtimes: dict[tuple[str | None, str], PDRuntime] = {}
        self._links_index: dict[tuple[str | None, str], list[tuple[str | None, str]]] | None = None

    def index_links(self) -> None:
        """Index the links by the PD cluster they name, for one cycle (``World.links_to`` scans every link: a
        cycle over N clusters would be O(N^2)). :meth:`links_to` re-reads each indexed link from the world, so
        a link changed since is seen as it is now; one added since waits for the next cycle (its watch event
        nudges the cluster there anyway). ``drop_links_index`` ends it."""
        index: dict[tuple[str | None, str], list[tuple[str | None, str]]] = {}
        for link in self.world.all(KIND_INTER_DC_LINK):
            if link.valid:
                index.setdefault((link.namespace, link.model.spec.pd_cluster_ref.name), []).append(link.key)
        self._links_index = index

    def drop_links_index(self) -> None:
        self._links_index = None

    def links_to(self, namespace: str | None, pd_cluster: str) -> list[Entry]:
        """``World.links_to``, from this cycle's index when there is one."""
        if self._links_index is None:
            return self.world.links_to(namespace, pd_cluster)
        out = []
        for key in self._links_index.get((namespace, pd_cluster), ()):
            link = self.world.get(KIND_INTER_DC_LINK, *key)
            if link is not None and link.valid and link.model.spec.pd_cluster_ref.name == pd_cluster:
                out.append(link)
        return out

    def runtime(self, entry: Entry) -> PDRuntime:
        return self.runtimes.setdefault(entry.key, PDRuntime())

    def forget(self, key: tuple[str | None, str]) -> None:
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

    def period_run(self, entry: Entry) -> bool:
        """Whether its next run is a period's (not a drain poll's): only those pull others into step."""
        return not self.runtime(entry).polling

    def inputs_for(self, key: tuple[str | None, str]) -> PlanInputs | None:
        rt = self.runtimes.get(key)
        return rt.inputs if rt else None

    # --- references ---------------------------------------------------------------------------------
    def resolve(self, entry: Entry) -> tuple[Refs | None, str, str]:
        pd: PDCluster = entry.model
        ns = entry.namespace
        profile = self.world.get(KIND_MODEL_PROFILE, None, pd.spec.model_profile_ref.name)
        if profile is None:
            return (
                None,
                "DanglingReference",
                f"spec.modelProfileRef: ModelProfile {pd.spec.model_profile_ref.name!r} not found",
            )
        if not profile.valid:
            return None, "InvalidReference", f"spec.modelProfileRef: ModelProfile {profile.name!r} is invalid"
        links = sorted(self.links_to(ns, entry.name), key=lambda e: e.name)
        if not links:
            return None, "NoInterDCLink", f"no InterDCLink in namespace {ns} names pdClusterRef {entry.name!r}"
        prefills: dict[str, PrefillCluster] = {}
        prefill_entries: dict[str, Entry] = {}
        for link in links:
            ref = link.model.spec.prefill_cluster_ref.name
            pfc = self.world.get(KIND_PREFILL_CLUSTER, ns, ref)
            if pfc is None:
                return None, "DanglingReference", f"InterDCLink {link.name}: PrefillCluster {ref!r} not found"
            if not pfc.valid:
                return None, "InvalidReference", f"InterDCLink {link.name}: PrefillCluster {ref!r} is invalid"
            prefills[ref] = pfc.model
            prefill_entries[ref] = pfc
        return Refs(profile.model, [e.model for e in links], prefills, prefill_entries), "", ""

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
        started = time.perf_counter()
        try:
            await self._reconcile(entry, snap, now_s, run_loop)
        finally:
            self.metrics.reconcile_seconds.labels(kind=KIND_PD_CLUSTER).observe(time.perf_counter() - started)

    async def _reconcile(self, entry: Entry, snap: Snapshot | None, now_s: float, run_loop: bool) -> None:
        log = logger(KIND_PD_CLUSTER, entry.namespace, entry.name)
        gen = entry.generation
        status = entry.status
        conds: list[JsonDict] = list(status.get("conditions") or [])
        if entry.paused:
            conds = set_condition(
                conds,
                "Paused",
                True,
                "PausedByAnnotation",
                f"{ANNOTATION_PAUSED}=true: reconciliation is paused; nothing is observed or acted on",
                now_s,
                gen,
            )
            if await self.writer.write(entry, {"conditions": conds}):
                log.info("paused", annotation=ANNOTATION_PAUSED)
            return
        paused = get_condition(conds, "Paused")
        if paused is not None and paused.get("status") == "True":
            conds = set_condition(conds, "Paused", False, "Resumed", "reconciliation resumed", now_s, gen)
        if not entry.valid:
            await self._not_ready(entry, conds, "InvalidSpec", "; ".join(entry.problems), now_s, log)
            return
        refs, reason, message = self.resolve(entry)
        if refs is None:
            await self._not_ready(entry, conds, reason, message, now_s, log)
            return
        try:
            inputs = self._inputs(entry, refs)
        except (PlanInputError, ValueError) as exc:
            await self._not_ready(entry, conds, "PlanInputsInvalid", str(exc), now_s, log)
            return
        if not run_loop:
            return
        await self._cycle(entry, refs, inputs, snap, conds, now_s, log)

    async def _not_ready(
        self, entry: Entry, conds: list[JsonDict], reason: str, message: str, now_s: float, log: Any
    ) -> None:
        old = get_condition(conds, "Ready") or {}
        conds = set_condition(conds, "Ready", False, reason, message, now_s, entry.generation)
        await self.writer.write(entry, {"observedGeneration": entry.generation, "conditions": conds})
        if old.get("reason") != reason or old.get("message") != message:
            log.warning("not ready", reason=reason, message=message)
            await post_event(self.api, entry.body, "Warning", reason, message, now_s)

    async def _cycle(
        self,
        entry: Entry,
        refs: Refs,
        inputs: PlanInputs,
        snap: Snapshot | None,
        conds: list[JsonDict],
        now_s: float,
        log: Any,
    ) -> None:
        pd: PDCluster = entry.model
        rt = self.runtime(entry)
        ns = entry.namespace or "default"
        status = entry.status
        params = RolePolicyParams.from_spec(pd.spec)
        params = replace(params, drain_poll_s=min(params.drain_poll_s, params.period_s))
        pods = [p for p in self.world.pods_of(entry.namespace, LABEL_PD_CLUSTER, entry.name) if not retired(p)]
        gen = entry.generation
        conds = set_condition(conds, "Ready", True, "Reconciled", "spec valid and references resolved", now_s, gen)

        decision: RoleDecision
        unassigned = [p for p in pods if _labels(p).get(LABEL_ROLE) not in ("prefill", "decode")]
        if unassigned and pd.spec.role_assignment.mode == "Relabel":
            # first roles need no metrics: the instances serve nothing yet
            decision, roles = await asyncio.to_thread(self._initial, pd, inputs, params, pods, unassigned, status)
            if not params.dry_run:
                await self.actuator.assign(ns, roles)
            rt.next_due_s, rt.polling = now_s + params.period_s, False
        else:
            metrics, why = (
                (None, "no Prometheus snapshot this cycle")
                if snap is None
                else snap.for_cluster((ns, entry.name), self.prometheus_url(entry))
            )
            if metrics is None:
                kind = "PrometheusUnavailable" if "failed" in (why or "") else "PrometheusNoData"
                self.metrics.prometheus_errors.labels(reason=kind).inc()
                conds = set_condition(
                    conds,
                    "Degraded",
                    True,
                    kind,
                    f"{why}; holding the last decision, no flips until metrics return",
                    now_s,
                    gen,
                )
                rt.next_due_s, rt.polling = now_s + params.period_s, False
                rt.last_run_s = now_s
                if await self.writer.write(entry, {"observedGeneration": gen, "conditions": conds}):
                    log.warning("holding: no metrics", reason=kind, message=why)
                await self._publish(entry, refs, pods, status.get("thresholdMinTokens"), pd)
                return

            obs = self._observation(pods, metrics, refs)
            if rt.verdict is None and rt.streak == 0 and isinstance(status.get("loop"), dict):
                # a restarted operator: the persistence streak comes back from status, not memory
                rt.verdict, rt.streak = status["loop"].get("verdict"), int(status["loop"].get("streak") or 0)
            state = restore_state(pods, status, rt.verdict, rt.streak, now_s)
            t_now = self._threshold(status, inputs, obs, params)
            fixed = _Fixed(obs)
            loop = LongTermLoop(
                params,
                inputs,
                fixed,
                fixed,
                lambda: float(t_now),
                state=state,
                history_limit=pd.spec.policy.history_limit,
            )
            loop.last_run_s = rt.last_run_s
            decision = await asyncio.to_thread(loop.run_once, now_s)  # CPU-bound core; keep the loop free
            if fixed.applied:
                try:
                    await self.actuator.apply(pd, decision, now_s)
                except ApiError as exc:
                    conds = set_condition(
                        conds, "Degraded", True, "ActuationFailed", f"{decision.action}: {exc}", now_s, gen
                    )
                    await self.writer.write(entry, {"conditions": conds})
                    log.error("actuation failed", action=decision.action, error=str(exc))
                    rt.next_due_s, rt.polling = now_s + params.drain_poll_s, True
                    return
            rt.verdict, rt.streak = loop.state.verdict, loop.state.streak
            rt.next_due_s, rt.polling = loop.next_due_s(), loop.state.pending is not None
        rt.last_run_s = now_s

        t_min = (
            decision.threshold_min_tokens
            if decision.threshold_min_tokens is not None
            else status.get("thresholdMinTokens")
        )
        t_in_force = self._t_in_force(t_min, params, refs, entry)
        record = decision_record(decision, now_s, t_in_force)
        rec = record.to_manifest()
        if params.dry_run and decision.action not in ("Hold", "Suspended"):
            rec["reason"] = (DRY_RUN_PREFIX + rec["reason"])[:1024]
        history = list(status.get("decisions") or [])
        last = history[-1] if history else None
        history = append_history(history, rec, pd.spec.policy.history_limit)

        pods_now = [p for p in self.world.pods_of(entry.namespace, LABEL_PD_CLUSTER, entry.name) if not retired(p)]
        cm = await self._publish(entry, refs, pods_now, t_min, pd)
        scaled = await self.actuator.scale_counts(pd)  # Scale mode: the workloads' replicas (two GETs)
        new_status = self._status(
            entry, pd, decision, rec, history, pods_now, t_min, t_in_force, cm, conds, now_s, params, scaled
        )
        new_status["loop"] = {"verdict": rt.verdict, "streak": rt.streak}
        await self.writer.write(entry, new_status)

        kind = reason_kind(rec["reason"])
        self.metrics.decisions.labels(
            action=decision.action, reason_kind=kind, namespace=ns, pd_cluster=entry.name
        ).inc()
        for role in ("prefill", "decode"):
            self.metrics.role_instances.labels(namespace=ns, pd_cluster=entry.name, role=role).set(
                sum(1 for p in pods_now if _labels(p).get(LABEL_ROLE) == role)
            )
        acted = decision.action not in ("Hold", "Suspended")
        repeated = params.dry_run and last is not None and last.get("action") == decision.action
        if acted and not repeated:
            await post_event(self.api, entry.body, "Normal", decision.action, rec["reason"], now_s)
        log_fn = log.info if acted else log.debug
        log_fn(
            "decision",
            action=decision.action,
            reason=rec["reason"],
            reason_kind=kind,
            prefill=f"{decision.prefill_from}->{decision.prefill_to}",
            decode=f"{decision.decode_from}->{decision.decode_to}",
            threshold_tokens=t_in_force,
            dry_run=params.dry_run,
        )

    # --- pieces -------------------------------------------------------------------------------------
    def _initial(
        self,
        pd: PDCluster,
        inputs: PlanInputs,
        params: RolePolicyParams,
        pods: list[JsonDict],
        unassigned: list[JsonDict],
        status: JsonDict,
    ) -> tuple[RoleDecision, list[tuple[str, str]]]:
        """Relabel mode, instances without a role: the override, initialPrefill, or the planner's split."""
        have_p = sum(1 for p in pods if _labels(p).get(LABEL_ROLE) == "prefill")
        have_d = sum(1 for p in pods if _labels(p).get(LABEL_ROLE) == "decode")
        if params.override_prefill is not None:
            target, why = params.override_prefill, "overrides.prefillInstances"
        elif pd.spec.role_assignment.initial_prefill is not None:
            target, why = pd.spec.role_assignment.initial_prefill, "roleAssignment.initialPrefill"
        else:
            target, why = plan(inputs).prfaas_pd.point.n_prefill, "the planner's split"
        target = max(params.prefill_min, min(params.prefill_max, target, len(pods) - params.decode_min))
        roles: list[tuple[str, str]] = []
        n_p = have_p
        for pod in unassigned:
            role = "prefill" if n_p < target else "decode"
            n_p += role == "prefill"
            roles.append((str(pod["metadata"]["name"]), role))
        n_d = len(pods) - n_p
        t_min = compute_balanced_threshold(inputs, n_p)
        reason = (
            f"initial role assignment ({why}): {len(unassigned)} unlabelled instance(s) -> {n_p} prefill, {n_d} decode"
        )
        decision = RoleDecision(
            "Rebalance",
            reason,
            have_p,
            have_d,
            n_p,
            n_d,
            RoleState(threshold_min_tokens=t_min),
            threshold_min_tokens=t_min,
        )
        return decision, roles

    def _observation(self, pods: list[JsonDict], metrics: ClusterMetrics, refs: Refs) -> RoleObservation:
        instances = []
        for p in pods:
            role = _labels(p).get(LABEL_ROLE)
            if role not in ("prefill", "decode"):
                continue
            name = str(p["metadata"]["name"])
            r: Role = "prefill" if role == "prefill" else "decode"
            instances.append(
                InstanceState(
                    name, r, round(metrics.in_flight.get(name, 0.0)), _labels(p).get(LABEL_DRAINING) == "true"
                )
            )
        prfaas_queue, ready = 0.0, None
        for pfc_entry in refs.prefill_entries.values():
            ok = get_condition(pfc_entry.status.get("conditions") or [], "Ready")
            if ok and ok.get("status") == "True" and pfc_entry.status.get("lastSyncTime"):
                prfaas_queue += float(pfc_entry.status.get("queueDepth") or 0.0)
                ready = (ready or 0) + int(pfc_entry.status.get("readyInstances") or 0)
        return RoleObservation(
            tuple(instances),
            prefill=StageLoad(metrics.queue_depth.get("prefill", 0.0), metrics.kv_cache_usage.get("prefill", 0.0)),
            decode=StageLoad(metrics.queue_depth.get("decode", 0.0), metrics.kv_cache_usage.get("decode", 0.0)),
            prfaas=StageLoad(prfaas_queue),
            n_prfaas_ready=ready,
        )

    def _threshold(self, status: JsonDict, inputs: PlanInputs, obs: RoleObservation, params: RolePolicyParams) -> float:
        """The ``t`` in force for the model verdict: the override, the last published one, or Eq. 7 now."""
        if params.override_threshold is not None:
            return float(params.override_threshold)
        for key in ("thresholdTokens", "thresholdMinTokens"):
            if isinstance(status.get(key), int) and status[key] > 0:
                return float(status[key])
        t = compute_balanced_threshold(inputs, obs.count("prefill"))
        return float(t) if t is not None else float(inputs.lengths.support()[1])

    def _t_in_force(self, t_min: Any, params: RolePolicyParams, refs: Refs, entry: Entry) -> int | None:
        if params.override_threshold is not None:
            return params.override_threshold
        if not isinstance(t_min, int):
            return None
        floors: list[int] = []
        for link in self.links_to(entry.namespace, entry.name):
            st = link.status
            if st.get("state") == "Scarce" and isinstance(st.get("thresholdFloorTokens"), int):
                floors.append(int(st["thresholdFloorTokens"]))
        return max([t_min, *floors])

    async def _publish(self, entry: Entry, refs: Refs, pods: list[JsonDict], t_min: Any, pd: PDCluster) -> str | None:
        override = pd.spec.overrides.threshold_tokens
        lo = override if override is not None else (t_min if isinstance(t_min, int) else 0)
        hi = override if override is not None else router_config.T_MAX
        config = router_config.build(pd, pods, refs.profile.spec, refs.links, refs.prefill_clusters, lo, hi)
        try:
            return await self.publisher.publish(entry.body, config)
        except ApiError as exc:
            logger(KIND_PD_CLUSTER, entry.namespace, entry.name).error("router config not published", error=str(exc))
            return None

    def _status(
        self,
        entry: Entry,
        pd: PDCluster,
        decision: RoleDecision,
        rec: JsonDict,
        history: list[JsonDict],
        pods: list[JsonDict],
        t_min: Any,
        t_in_force: int | None,
        cm: str | None,
        conds: list[JsonDict],
        now_s: float,
        params: RolePolicyParams,
        scaled: tuple[int, int] | None = None,
    ) -> JsonDict:
        gen = entry.generation
        counts: dict[str, dict[str, int]] = {}
        for role in ("prefill", "decode"):
            mine = [p for p in pods if _labels(p).get(LABEL_ROLE) == role]
            counts[role] = {
                "current": len(mine),
                "ready": sum(1 for p in mine if pod_ready(p)),
                "draining": sum(1 for p in mine if _labels(p).get(LABEL_DRAINING) == "true"),
            }
        desired_p, desired_d = decision.prefill_to, decision.decode_to
        pending = decision.state.pending
        if pending is not None and not params.dry_run:
            k = len(pending.instances)
            desired_p, desired_d = (
                (decision.prefill_from - k, decision.decode_from + k)
                if pending.direction == "FlipToDecode"
                else (decision.prefill_from + k, decision.decode_from - k)
            )
        elif scaled is not None and not params.dry_run:
            # Scale mode: desired is what the two workloads ask for (the operator writes it); the pods follow
            desired_p, desired_d = scaled
        if params.override_prefill is not None:
            desired_p, desired_d = params.override_prefill, len(pods) - params.override_prefill
        counts["prefill"]["desired"], counts["decode"]["desired"] = max(desired_p, 0), max(desired_d, 0)
        draining = pending is not None and not params.dry_run
        conds = set_condition(
            conds,
            "Progressing",
            draining,
            "Draining" if draining else "Steady",
            rec["reason"] if draining else "no flip in progress",
            now_s,
            gen,
        )
        conds = set_condition(
            conds, "Degraded", False, "MetricsAvailable", "Prometheus answered this cycle", now_s, gen
        )
        controls = []
        if params.dry_run:
            controls.append("policy.dryRun")
        if params.suspend:
            controls.append("policy.suspend")
        if pd.spec.overrides.prefill_instances is not None:
            controls.append(f"overrides.prefillInstances={pd.spec.overrides.prefill_instances}")
        if pd.spec.overrides.threshold_tokens is not None:
            controls.append(f"overrides.thresholdTokens={pd.spec.overrides.threshold_tokens}")
        conds = set_condition(
            conds,
            "Overridden",
            bool(controls),
            "OperatorControls" if controls else "None",
            ", ".join(controls) or "no SRE control in force",
            now_s,
            gen,
        )
        link_util = ""
        links = self.links_to(entry.namespace, entry.name)
        if links:
            link_util = str(links[0].status.get("utilizationPercent") or "")
        t_max = (
            pd.spec.overrides.threshold_tokens
            if pd.spec.overrides.threshold_tokens is not None
            else router_config.T_MAX
        )
        return {
            "observedGeneration": gen,
            "prefill": counts["prefill"],
            "decode": counts["decode"],
            "thresholdTokens": t_in_force,
            "thresholdMinTokens": (
                pd.spec.overrides.threshold_tokens
                if pd.spec.overrides.threshold_tokens is not None
                else t_min
                if isinstance(t_min, int)
                else None
            ),
            "thresholdMaxTokens": t_max,
            "lastDecision": rec,
            "decisions": history,
            "routerConfigMap": cm,
            "summary": {
                "prefill": f"{counts['prefill']['ready']}/{counts['prefill']['desired']}",
                "decode": f"{counts['decode']['ready']}/{counts['decode']['desired']}",
                "threshold": format_tokens(t_in_force),
                "link": link_util,
            },
            "conditions": conds,
        }


def unchanged(old: JsonDict, new: JsonDict) -> bool:
    return not status_changed(old, new)


__all__ = ["PDClusterReconciler", "PDRuntime", "iso", "restore_state", "retired"]
