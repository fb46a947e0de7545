"""The batched cycle: every tick, work out what is due, collect its metrics once, reconcile it.

One task for all objects (instead of a kopf timer per object) because batching needs one collector per
cycle: with 1,000 PD clusters a cycle is a handful of Prometheus queries, not thousands. Objects changed by
a watch event are reconciled at the next tick (their spec-level status at once; their loop when due).
Only the Lease holder runs it. Time is read once per tick and passed down.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable

from prfaas_core.names import KIND_INTER_DC_LINK, KIND_MODEL_PROFILE, KIND_PD_CLUSTER, KIND_PREFILL_CLUSTER

from . import model_profile
from .config import OperatorConfig
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
    ) -> None:
        self.config, self.api, self.world, self.writer = config, api, world, writer
        self.leader, self.collector, self.metrics, self.clock = leader, collector, metrics, clock
        self.pd, self.prefill, self.link = pd, prefill, link
        self.dirty: set[tuple[str, Key]] = set()
        self.wake = asyncio.Event()
        self._sem = asyncio.Semaphore(concurrency)
        self.cycles = 0
        self.last_snapshot: Snapshot | None = None
        self.log = logger("Operator", None, "cycle")

    def nudge(self, kind: str, key: Key) -> None:
        self.dirty.add((kind, key))
        self.wake.set()

    def nudge_all(self) -> None:
        for kind in self.world.objects:
            for entry in self.world.all(kind):
                self.dirty.add((kind, entry.key))
        self.wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=self.config.tick_s)
            self.wake.clear()
            if stop.is_set() or not self.leader.is_leader:
                continue
            await asyncio.sleep(0.05)  # let a burst of watch events land in one tick
            try:
                await self.tick(self.clock())
            except Exception as exc:
                self.log.exception("cycle failed", error=str(exc))

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

        await asyncio.gather(*(one(e) for e in entries))

    async def tick(self, now_s: float) -> Snapshot | None:
        started = time.perf_counter()
        dirty, self.dirty = self.dirty, set()
        w = self.world

        def is_dirty(e: Entry) -> bool:
            return (e.kind, e.key) in dirty

        await self._each(
            [e for e in w.all(KIND_MODEL_PROFILE) if is_dirty(e)],
            lambda e: model_profile.reconcile(self.api, self.writer, e, now_s),
        )

        pfcs = list(w.all(KIND_PREFILL_CLUSTER))
        pfc_due = {e.key for e in pfcs if e.valid and not e.paused and self.prefill.next_due.get(e.key, 0.0) <= now_s}
        links = list(w.all(KIND_INTER_DC_LINK))
        link_due = {e.key for e in links if e.valid and not e.paused and self.link.next_due.get(e.key, 0.0) <= now_s}
        pds = list(w.all(KIND_PD_CLUSTER))
        pd_due = {e.key for e in pds if self.pd.due(e, now_s)}

        snap: Snapshot | None = None
        if pd_due or link_due or pfc_due:
            due_pds = [e for e in pds if e.key in pd_due]
            for e in due_pds:
                self.pd.runtime(e)  # so links can find the inputs once the PD has run
            managed = {self.config.prometheus_url for e in pfcs if e.key in pfc_due and e.model.spec.mode == "Managed"}
            snap = await self.collector.collect(
                now_s,
                [self.pd.query(e) for e in due_pds],
                [self.link.query(e) for e in links if e.key in link_due and self.link._problem(e) is None],
                managed,
            )
            self.last_snapshot = snap

        for key in pfc_due:
            self.prefill.next_due[key] = now_s + self.config.gateway_period_s
        await self._each(
            [e for e in pfcs if e.key in pfc_due or is_dirty(e)],
            lambda e: self.prefill.reconcile(e, snap, now_s, e.key in pfc_due),
        )
        await self._each(
            [e for e in pds if e.key in pd_due or is_dirty(e)],
            lambda e: self.pd.reconcile(e, snap, now_s, e.key in pd_due),
        )
        for key in link_due:
            self.link.next_due[key] = now_s + self.config.link_period_s
        await self._each(
            [e for e in links if e.key in link_due or is_dirty(e)],
            lambda e: self.link.reconcile(e, snap, now_s, e.key in link_due),
        )
        if snap is not None:
            self.cycles += 1
            self.metrics.prometheus_queries.inc(snap.queries)
            self.metrics.cycle_seconds.observe(time.perf_counter() - started)
            self.log.debug(
                "cycle",
                pd_clusters=len(pd_due),
                links=len(link_due),
                prefill_clusters=len(pfc_due),
                queries=snap.queries,
                seconds=round(time.perf_counter() - started, 3),
            )
        return snap
