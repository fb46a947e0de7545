"""Wiring: builds the operator's object graph from its config and runs kopf embedded.

:func:`build` is the factory (no singletons): one API client, one world, one metrics registry, one
collector, the reconcilers, the Lease elector and the cycle, all passed down explicitly. It knows nothing of
the handlers: :mod:`.handlers` registers them and calls :func:`build` from its startup handler, and
:mod:`.embedded` (``prfaas operator``) or :mod:`.kopf_entry` (``kopf run``) runs kopf with them.

Besides kopf's watch events, every replica re-lists what it serves every ``resync_s`` (:meth:`Operator.resync`):
a watch can drop an event (a reconnect gap, an overloaded replica), and a missed creation would otherwise strand
an object until its next change.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from prfaas_core.names import (
    API_GROUP,
    FINALIZER,
    GROUP_VERSION,
    KIND_MODEL_PROFILE,
    KIND_PD_CLUSTER,
    KIND_PREFILL_CLUSTER,
    LABEL_PD_CLUSTER,
    LABEL_PREFILL_CLUSTER,
)

from .actuate import KubeActuator
from .config import OperatorConfig
from .cycle import Cycle
from .kube import JsonDict, KubeApi, KubeCredentials, api_path, list_labelled
from .leader import LeaderElector
from .link import LinkReconciler
from .logs import logger
from .metrics import OperatorMetrics
from .observe import PrometheusCollector
from .pd_cluster import PDClusterReconciler
from .prefill_cluster import PrefillClusterReconciler, is_managed
from .registry import PLURALS, Entry, Key, ResyncPlan, World, parse, resync_plan, status_only
from .router_config import RouterConfigPublisher
from .writer import StatusWriter


@dataclass
class Operator:
    config: OperatorConfig
    creds: KubeCredentials
    api: KubeApi
    world: World
    metrics: OperatorMetrics
    writer: StatusWriter
    publisher: RouterConfigPublisher
    pd: PDClusterReconciler
    leader: LeaderElector
    cycle: Cycle
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def connection_info(self, relogin: bool = False) -> kopf.ConnectionInfo:
        """kopf's credentials; ``relogin``: kopf's last ones expired or were refused, so refresh them."""
        if relogin:
            self.creds.refused()
        return connection_info(self.creds)

    def serves(self, namespace: str | None) -> bool:
        return self.config.all_namespaces or namespace is None or namespace in self.config.namespaces

    def accept(self, entry: Entry, dirty: bool) -> None:
        """A watch event's object (already parsed); reconciled at the next tick if ``dirty``."""
        if not self.serves(entry.namespace):
            return
        stored = self.world.upsert(entry.kind, entry.body)
        if dirty:
            self.cycle.nudge(stored.kind, stored.key)
            self._nudge_dependents(stored)

    def _nudge_dependents(self, entry: Entry) -> None:
        """A new or changed object can resolve (or break) the references of others (at the next tick)."""
        self.cycle.nudge_dependents(entry.kind, entry.namespace)

    def forget(self, kind: str, body: JsonDict) -> None:
        meta = body.get("metadata") or {}
        key = (meta.get("namespace"), str(meta.get("name")))
        self.world.remove(kind, key)
        if kind == KIND_PD_CLUSTER:
            self.pd.forget(key)
        self._nudge_dependents(Entry(kind, body))

    @staticmethod
    def owns_config_map(kind: str, body: JsonDict) -> bool:
        """Whether the operator writes a ConfigMap for this object: a PDCluster (its routers'), a Managed
        PrefillCluster (its gateway's). Such kinds carry a finalizer; the others own nothing."""
        return kind == KIND_PD_CLUSTER or (kind == KIND_PREFILL_CLUSTER and is_managed(body))

    async def deleted(self, kind: str, body: JsonDict) -> None:
        """An object is gone (its finalizer, or a re-list that no longer finds it): remove the ConfigMap the
        operator owns for it, if any, then forget it. The caller holds the Lease."""
        meta = body.get("metadata") or {}
        ns, name = str(meta.get("namespace") or "default"), str(meta["name"])
        if kind == KIND_PD_CLUSTER:
            removed = await self.publisher.delete(ns, name)
            logger(kind, ns, name).info("deleted", router_config_removed=removed)
        elif self.owns_config_map(kind, body):
            removed = await self.publisher.delete_gateway(ns, name)
            logger(kind, ns, name).info("deleted", gateway_config_removed=removed)
        self.forget(kind, body)

    def pod_changed(self, body: JsonDict) -> None:
        """A labelled pod's new state. A prefill pod nudges its PrefillCluster, whose gateway lists it."""
        self.world.upsert_pod(body)
        self._nudge_prefill_cluster(body)

    def pod_gone(self, namespace: str | None, name: str) -> None:
        body = self.world.pods.get((namespace, name))
        self.world.remove_pod(namespace, name)
        if body is not None:
            self._nudge_prefill_cluster(body)

    def _nudge_prefill_cluster(self, pod: JsonDict) -> None:
        meta = pod.get("metadata") or {}
        owner = (meta.get("labels") or {}).get(LABEL_PREFILL_CLUSTER)
        if owner and self.world.get(KIND_PREFILL_CLUSTER, meta.get("namespace"), str(owner)) is not None:
            self.cycle.nudge(KIND_PREFILL_CLUSTER, (meta.get("namespace"), str(owner)))

    # --- the periodic re-list ----------------------------------------------------------------------------
    def _collections(self, plural: str, namespaced: bool = True) -> list[str]:
        gv = "v1" if plural == "pods" else GROUP_VERSION
        if not namespaced or self.config.all_namespaces:
            return [api_path(gv, plural)]
        return [api_path(gv, plural, ns) for ns in self.config.namespaces]

    async def _list_kind(self, kind: str) -> list[JsonDict]:
        items: list[JsonDict] = []
        for path in self._collections(PLURALS[kind], namespaced=kind != KIND_MODEL_PROFILE):
            items += await self.api.list(path)
        # list items may omit kind/apiVersion (the object's Events and owner references need them)
        return [{"apiVersion": GROUP_VERSION, "kind": kind, **i} for i in items]

    async def _list_pods(self) -> list[JsonDict]:
        by_key: dict[Key, JsonDict] = {}
        for path in self._collections("pods"):
            for label in (LABEL_PD_CLUSTER, LABEL_PREFILL_CLUSTER):
                for pod in await list_labelled(self.api, path, label):
                    meta = pod.get("metadata") or {}
                    by_key[(meta.get("namespace"), str(meta.get("name")))] = pod
        return list(by_key.values())

    async def _apply(self, kind: str | None, plan: ResyncPlan) -> None:
        """Upserts as watch events would (dirty), removals by the delete handlers' path (the leader cleans up
        what the object owned; a standby only forgets)."""
        label = kind or "Pod"
        for body in plan.upserts:
            key = (body["metadata"].get("namespace"), str(body["metadata"].get("name")))
            old = self.world.pods.get(key) if kind is None else getattr(self.world.get(kind, *key), "body", None)
            if kind is None:
                self.pod_changed(body)
            elif old is not None and status_only(old, body):
                # a newer status only. The leader's own writes are folded into its cache already (and one landing
                # while this list was in flight must not be rolled back); a standby takes it, to lead warm.
                if not self.leader.is_leader:
                    self.accept(parse(kind, body), dirty=False)
                continue
            else:
                self.accept(parse(kind, body), dirty=True)
            self.log_repair(label, body, "add" if old is None else "update")
        for key in plan.removals:
            if kind is None:
                body = self.world.pods.get(key) or {"metadata": {"namespace": key[0], "name": key[1]}}
                self.pod_gone(*key)
            else:
                entry = self.world.get(kind, *key)
                if entry is None:
                    continue
                body = entry.body
                if self.leader.is_leader and self.owns_config_map(kind, body):
                    await self.deleted(kind, body)
                else:
                    self.forget(kind, body)
            self.log_repair(label, body, "remove")

    def log_repair(self, kind: str, body: JsonDict, action: str) -> None:
        """``add``: the watch never announced it; ``update``: the cache held an older version (a lost event, or
        one still in flight); ``remove``: it is gone without a DELETED event."""
        meta = body.get("metadata") or {}
        self.metrics.resync_repairs.labels(kind=kind, action=action).inc()
        logger(kind, meta.get("namespace"), str(meta.get("name"))).info("resync repaired the cache", repair=action)

    async def resync(self) -> int:
        """Re-list the four kinds and the labelled pods; repair what the watch missed. Returns the repairs.

        Each kind's cache versions are taken before its list is sent, so watch events that land meanwhile win
        (:func:`.registry.resync_plan`)."""
        repairs = 0
        for kind in (*PLURALS, None):
            before = self.world.versions(kind)
            listed = await (self._list_pods() if kind is None else self._list_kind(kind))
            plan = resync_plan(before, self.world.bodies(kind), listed)
            await self._apply(kind, plan)
            repairs += len(plan.upserts) + len(plan.removals)
        return repairs

    async def resync_once(self) -> bool:
        """One re-list; a failure (API down) is logged and counted, and the next period tries again."""
        log = logger("Operator", None, "resync")
        started = time.perf_counter()
        try:
            repairs = await self.resync()
        except Exception as exc:
            self.metrics.resyncs.labels(result="error").inc()
            log.warning("resync failed; retrying next period", error=str(exc), period_s=self.config.resync_s)
            return False
        self.metrics.resyncs.labels(result="ok").inc()
        seconds = round(time.perf_counter() - started, 3)
        (log.info if repairs else log.debug)("resync", repairs=repairs, seconds=seconds)
        return True

    async def run_resync(self, stop: asyncio.Event) -> None:
        """Every ``resync_s``, off the cycle's path (the first after one period: kopf's initial list fills the
        cache at startup)."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.config.resync_s)
            if not stop.is_set():
                await self.resync_once()

    def on_leadership(self, leader: bool) -> None:
        self.metrics.leader.set(1 if leader else 0)
        if leader:
            self.cycle.nudge_all()

    async def start(self) -> None:
        if self.config.metrics_port:
            self.metrics.serve(self.config.metrics_port, self.config.metrics_host, self.cycle.health)
        self.tasks = [
            asyncio.create_task(self.leader.run(self.stop), name="prfaas-lease"),
            asyncio.create_task(self.cycle.run(self.stop), name="prfaas-cycle"),
            asyncio.create_task(self.run_resync(self.stop), name="prfaas-resync"),
        ]
        self.cycle.health.watch(self.tasks)

    async def shutdown(self) -> None:
        self.cycle.health.stopping()
        self.stop.set()
        self.cycle.wake.set()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, timeout=10)
        await self.leader.release()
        await self.cycle.prefill.gateways.aclose()
        await self.api.aclose()
        self.metrics.stop()


def connection_info(creds: KubeCredentials) -> kopf.ConnectionInfo:
    """kopf's login: the current token, with its expiry (kopf logs in again before it, and after a 401)."""
    token = creds.bearer()
    return kopf.ConnectionInfo(
        server=creds.server,
        ca_path=creds.ca_path,
        insecure=creds.insecure,
        token=token,
        scheme="Bearer" if token else None,
        certificate_path=creds.cert_path,
        private_key_path=creds.key_path,
        default_namespace=creds.default_namespace,
        expiration=creds.expires(),
    )


def build(config: OperatorConfig, creds: KubeCredentials | None = None) -> Operator:
    creds = creds or KubeCredentials.load(config.kubeconfig)
    metrics = OperatorMetrics()
    api = KubeApi(
        creds,
        config.api_retries,
        config.api_backoff_s,
        on_retry=lambda status: metrics.api_retries.labels(status=str(status)).inc(),
    )
    world = World()
    writer = StatusWriter(api, world, config.status_heartbeat_s, config.status_heartbeat_cycles)
    publisher = RouterConfigPublisher(api)
    pd = PDClusterReconciler(api, world, writer, KubeActuator(api, world), publisher, metrics, config.prometheus_url)
    prefill = PrefillClusterReconciler(api, world, writer, metrics, config.prometheus_url, publisher, links=pd.links)
    link = LinkReconciler(api, world, writer, metrics, config.prometheus_url, pd.published)
    collector = PrometheusCollector(config.prometheus_timeout_s)
    holder: dict[str, Operator] = {}
    leader = LeaderElector(
        api,
        config.lease_ns,
        config.lease_name,
        config.identity,
        config.lease_duration_s,
        config.lease_renew_s,
        on_change=lambda is_leader: holder["op"].on_leadership(is_leader),
    )
    cycle = Cycle(config, api, world, writer, leader, collector, pd, prefill, link, metrics, clock=time.time)
    op = Operator(config, creds, api, world, metrics, writer, publisher, pd, leader, cycle)
    holder["op"] = op
    return op


KOPF_PREFIX = f"kopf.{API_GROUP}"
"""kopf's own annotations: not ``prfaas.io/`` itself, or kopf would ignore changes of ``prfaas.io/paused``."""


def configure_settings(settings: kopf.OperatorSettings) -> None:
    """kopf's settings, in one place (called from the one startup handler)."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=KOPF_PREFIX, key="last-handled-configuration"
    )
    settings.posting.enabled = False  # our own Events carry the reasons; kopf's would duplicate them
    settings.peering.standalone = True  # one active replica comes from our Lease, not kopf peering
    settings.watching.reconnect_backoff = 0.5
    settings.networking.request_timeout = 30
    # no cap on kopf's per-object workers: a cap queues the initial listing behind slow handler slots (at 32,
    # 100 PDClusters took minutes to reach the cache); the handlers only parse and store, the cycle does the work
    settings.batching.worker_limit = None


def plain(value: Any) -> Any:
    """kopf's read-only mapping views, deep-copied into plain dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def parse_body(kind: str, body: Any) -> Entry:
    """A kopf body into the core's model (the first thing every handler does)."""
    return parse(kind, plain(body))
