"""The batched cycle: every tick, work out what is due, collect its metrics once, reconcile it.

One task for all objects (instead of a kopf timer per object) because batching needs one collector per
cycle: with 1,000 PD clusters a cycle is a handful of Prometheus queries, not thousands. Objects changed by
a watch event are reconciled at the next tick (their spec-level status at once; their loop when due).
Only the Lease holder runs it. Time is read once per tick and passed down. Objects of a kind that are due
soon join a run of that kind (see ``tick``), so that objects that arrived at different times fall into step
and a cycle stays one collection. One ``cycle`` log line per cycle says what it covered and cost (objects,
Prometheus queries, API calls, status writes and the fields that moved them, seconds per phase).

Profiling: with ``PRFAAS_OPERATOR_PROFILE=FILE`` set, the event loop's thread runs under cProfile from the
first tick on and the cumulative stats are written to FILE after every cycle (``python -m pstats FILE``);
the benchmark (benchmarks/operator_scale.py ``--profile``) uses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import math
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from prfaas_core.names import KIND_INTER_DC_LINK, KIND_MODEL_PROFILE, KIND_PD_CLUSTER, KIND_PREFILL_CLUSTER

from . import model_profile
from .config import OperatorConfig
from .elastic_demand import pd_query, site_query
from .health import Health
from .kube import KubeApi
from .leader import LeaderElector
from .link import LinkReconciler
from .logs import logger
from .metrics import OperatorMetrics
from .observe import PrometheusCollector, Snapshot
from .pd_cluster import PDClusterReconciler
from .prefill_cluster import PrefillClusterReconciler
from .registry import Entry, Key, World
from .writer import StatusWriter


@dataclass(frozen=True)
class Due:
    """One tick's objects by kind, and the keys of those whose periodic work is due."""

    pfcs: list[Entry]
    links: list[Entry]
    pds: list[Entry]
    pfc: set[Key]
    link: set[Key]
    pd: set[Key]

    @property
    def any(self) -> bool:
        return bool(self.pfc or self.link or self.pd)


class Cycle:
    def __init__(
        self,
        config: OperatorConfig,
        api: KubeApi,
        world: World,
        writer: StatusWriter,
        leader: LeaderElector,
        collector: PrometheusCollector,
        pd: PDClusterReconciler,
        prefill: PrefillClusterReconciler,
        link: LinkReconciler,
        metrics: OperatorMetrics,
        clock: Callable[[], float] = time.time,
        concurrency: int = 16,
        coalesce: float = 0.5,
        health: Health | None = None,
    ) -> None:
        self.config, self.api, self.world, self.writer = config, api, world, writer
        self.leader, self.collector, self.metrics, self.clock = leader, collector, metrics, clock
        self.pd, self.prefill, self.link = pd, prefill, link
        self.dirty: set[tuple[str, Key]] = set()
        self._spread: dict[str | None, set[str]] = {}
        """Namespace (None: all) -> the kinds of the objects that changed there since the last tick."""
        self.wake = asyncio.Event()
        self._sem = asyncio.Semaphore(concurrency)
        self.coalesce = coalesce
        self.health = health or Health(config.liveness_stall_s)
        self.cycles = 0
        self.last_snapshot: Snapshot | None = None
        self._quiet: tuple[int, float] | None = None
        """(the world's version, a time): the last look over the fleet found nothing due before that time. While
        the objects stay at that version and nothing is reconciled, :meth:`_due` is the same empty answer until
        then, without a look over every object at every tick (one a second)."""
        self.log = logger("Operator", None, "cycle")

    def nudge(self, kind: str, key: Key) -> None:
        self.dirty.add((kind, key))
        self.wake.set()

    def nudge_dependents(self, kind: str, namespace: str | None) -> None:
        """A new, changed or removed ``kind`` object can resolve (or break) the references of the other kinds'
        objects in its namespace (None: every namespace): they are due at the next tick. Recorded here and expanded
        once per tick (:meth:`_take_dirty`): expanding at every watch event made a cold start quadratic (at 5,000
        PD clusters, 35,000 objects each nudged every other of their namespace; py-spy: all of the operator's time)."""
        self._spread.setdefault(namespace, set()).add(kind)
        self.wake.set()

    def _take_dirty(self) -> set[tuple[str, Key]]:
        """The objects due this tick: those nudged, and the dependents of every object that changed since the last."""
        dirty, self.dirty = self.dirty, set()
        spread, self._spread = self._spread, {}
        if spread:
            everywhere = spread.pop(None, set())
            for kind in self.world.objects:
                for entry in self.world.all(kind):
                    changed = everywhere | spread.get(entry.namespace, set())
                    if changed - {kind}:
                        dirty.add((kind, entry.key))
        return dirty

    def nudge_all(self) -> None:
        for kind in self.world.objects:
            for entry in self.world.all(kind):
                self.dirty.add((kind, entry.key))
        self.wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        profile_path = os.environ.get("PRFAAS_OPERATOR_PROFILE")
        profiler = cProfile.Profile() if profile_path else None
        if profiler is not None:
            profiler.enable()
        while not stop.is_set():
            self.health.beat()  # went round: liveness (a tick that never returns stops the beats)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=self.config.tick_s)
            self.wake.clear()
            if stop.is_set() or not self.leader.is_leader:
                continue
            await asyncio.sleep(0.05)  # let a burst of watch events land in one tick
            try:
                snap = await self.tick(self.clock())
            except Exception as exc:
                self.log.exception("cycle failed", error=str(exc))
                snap = None
            if profiler is not None and profile_path and snap is not None:
                profiler.dump_stats(profile_path)  # stops it
                profiler.enable()

    async def _each(self, entries: Iterable[Entry], fn: Callable[[Entry], Awaitable[None]]) -> None:
        async def one(entry: Entry) -> None:
            async with self._sem:
                if not self.leader.is_leader:
                    return
                try:
                    await fn(entry)
                except Exception as exc:
                    logger(entry.kind, entry.namespace, entry.name).exception("reconcile failed", error=str(exc))
                    self.dirty.add((entry.kind, entry.key))
                self.health.beat()  # a long tick that finishes objects is making progress

        await asyncio.gather(*(one(e) for e in entries))

    async def tick(self, now_s: float) -> Snapshot | None:
        """One tick: what is due, one collection for it, the reconciles (each kind reads only what the others
        published, so their order matters for nothing but freshness), one ``cycle`` log line."""
        started = time.perf_counter()
        calls, writes, reasons = self.api.calls, self.writer.writes, self.writer.reasons.copy()
        phases: dict[str, float] = {}
        dirty = self._take_dirty()
        await self._each(
            [e for e in self.world.all(KIND_MODEL_PROFILE) if (e.kind, e.key) in dirty],
            lambda e: model_profile.reconcile(self.api, self.writer, e, now_s),
        )
        due = self._due(now_s)
        snap: Snapshot | None = None
        if due.any:
            t0 = time.perf_counter()
            snap = await self._collect(now_s, due)
            phases["collect_s"] = time.perf_counter() - t0
        await self._reconcile(now_s, due, dirty, snap, phases)
        if snap is not None:
            moved = dict((self.writer.reasons - reasons).most_common(8))
            self._report(due, snap, started, self.api.calls - calls, self.writer.writes - writes, moved, phases)
        return snap

    def _due(self, now_s: float) -> Due:
        """What runs this tick. Objects of one kind due within half their period join a run of that kind that
        happens anyway, so that groups that came (or failed) at different times fall into step (any two groups
        merge within one period) and share one collection instead of each running its own tick. A PD cluster's
        drain poll (every few seconds while it drains) neither pulls others nor is pulled early."""
        w = self.world
        pfcs, links = list(w.all(KIND_PREFILL_CLUSTER)), list(w.all(KIND_INTER_DC_LINK))
        pds = list(w.all(KIND_PD_CLUSTER))
        quiet = self._quiet
        if quiet is not None and quiet[0] == w.version and now_s < quiet[1]:
            return Due(pfcs, links, pds, set(), set(), set())
        self._quiet = None

        def soon(next_due: dict[Key, float], entries: list[Entry], period_s: float) -> set[Key]:
            ok = [e for e in entries if e.valid and not e.paused]
            due = {e.key for e in ok if next_due.get(e.key, 0.0) <= now_s}
            if due:
                due |= {e.key for e in ok if next_due.get(e.key, 0.0) <= now_s + self.coalesce * period_s}
            return due

        pd_due = {e.key for e in pds if self.pd.due(e, now_s)}
        if any(self.pd.period_run(e) for e in pds if e.key in pd_due):
            pd_due |= {e.key for e in pds if self.pd.due(e, now_s, self.coalesce)}
        due = Due(
            pfcs,
            links,
            pds,
            soon(self.prefill.next_due, pfcs, self.config.gateway_period_s),
            soon(self.link.next_due, links, self.config.link_period_s),
            pd_due,
        )
        if not due.any:  # nothing due before the earliest next due time of any object
            times = [self.prefill.next_due.get(e.key, 0.0) for e in pfcs if e.valid and not e.paused]
            times += [self.link.next_due.get(e.key, 0.0) for e in links if e.valid and not e.paused]
            times += [t for t in map(self.pd.due_at, pds) if t is not None]
            self._quiet = (w.version, min(times, default=math.inf))
        return due

    async def _collect(self, now_s: float, due: Due) -> Snapshot:
        """One Prometheus collection for everything due."""
        managed = {self.config.prometheus_url for e in due.pfcs if e.key in due.pfc and e.model.spec.mode == "Managed"}
        sized = [  # elastic capacity (Operator mode): each region sizes what it owns
            site_query(e, self.config.prometheus_url)
            for e in due.pfcs
            if e.key in due.pfc and e.model.spec.mode == "Managed" and e.model.spec.scaling.mode == "Operator"
        ] + [
            pd_query(e, self.pd.prometheus_url(e))
            for e in due.pds
            if e.key in due.pd and e.model.spec.scaling.mode == "Operator"
        ]
        snap = await self.collector.collect(
            now_s,
            [self.pd.query(e) for e in due.pds if e.key in due.pd],
            [self.link.query(e) for e in due.links if e.key in due.link and self.link.problem(e) is None],
            managed,
            sized,
        )
        self.last_snapshot = snap
        return snap

    async def _reconcile(
        self, now_s: float, due: Due, dirty: set[tuple[str, Key]], snap: Snapshot | None, phases: dict[str, float]
    ) -> None:
        """Each kind's due and dirty objects (a dirty one that is not due gets its spec-level status only)."""

        def todo(entries: list[Entry], keys: set[Key]) -> list[Entry]:
            return [e for e in entries if e.key in keys or (e.kind, e.key) in dirty] if keys or dirty else []

        pfcs, pds, links = todo(due.pfcs, due.pfc), todo(due.pds, due.pd), todo(due.links, due.link)
        if not (pfcs or pds or links):
            return  # an idle tick (most of them: one a second): no link index to build over the whole fleet
        self._quiet = None  # what is due next is known again only after these
        for key in due.pfc:
            self.prefill.next_due[key] = now_s + self.config.gateway_period_s
        t0 = time.perf_counter()
        self.pd.links.build()  # (the PrefillClusters' reconciler shares it: runner.py)
        try:
            await self._each(pfcs, lambda e: self.prefill.reconcile(e, snap, now_s, e.key in due.pfc))
            phases["prefill_clusters_s"], t0 = time.perf_counter() - t0, time.perf_counter()
            await self._each(pds, lambda e: self.pd.reconcile(e, snap, now_s, e.key in due.pd))
        finally:
            self.pd.links.drop()
        phases["pd_clusters_s"], t0 = time.perf_counter() - t0, time.perf_counter()
        for key in due.link:
            self.link.next_due[key] = now_s + self.config.link_period_s
        await self._each(links, lambda e: self.link.reconcile(e, snap, now_s, e.key in due.link))
        phases["links_s"] = time.perf_counter() - t0

    def _report(
        self,
        due: Due,
        snap: Snapshot,
        started: float,
        api_calls: int,
        writes: int,
        moved: dict[str, int],
        phases: dict[str, float],
    ) -> None:
        """One line per cycle (not per object): what it covered and what it cost."""
        self.cycles += 1
        took = time.perf_counter() - started
        self.metrics.prometheus_queries.inc(snap.queries)
        self.metrics.cycle_seconds.observe(took)
        self.writer.cycle_took(took)  # a long cycle stretches the status heartbeat (writer.py)
        self.log.info(
            "cycle",
            pd_clusters=len(due.pd),
            links=len(due.link),
            prefill_clusters=len(due.pfc),
            queries=snap.queries,
            api_calls=api_calls,
            status_writes=writes,
            status_moved=moved,
            seconds=round(took, 3),
            heartbeat_seconds=round(self.writer.interval_s),
            **{k: round(v, 3) for k, v in phases.items()},
        )
