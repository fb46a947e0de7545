"""Wiring: builds the operator's object graph from its config and runs kopf embedded.

:func:`build` is the factory (no singletons): one API client, one world, one metrics registry, one
collector, the reconcilers, the Lease elector and the cycle, all passed down explicitly. kopf gets its own
:class:`kopf.OperatorRegistry` (``handlers.register``); ``kopf run -m prfaas_operator.kopf_entry`` uses
the default one and reads the config from the environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from prfaas_core.names import API_GROUP, FINALIZER, KIND_PD_CLUSTER

from .actuate import KubeActuator
from .config import OperatorConfig
from .cycle import Cycle
from .kube import JsonDict, KubeApi, KubeCredentials
from .leader import LeaderElector
from .link import LinkReconciler
from .logs import configure, logger
from .metrics import OperatorMetrics
from .observe import PrometheusCollector
from .pd_cluster import PDClusterReconciler
from .prefill_cluster import PrefillClusterReconciler
from .registry import Entry, World, parse
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

    def connection_info(self) -> kopf.ConnectionInfo:
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
        """A new or changed object can resolve (or break) the references of others."""
        for kind in self.world.objects:
            if kind != entry.kind:
                for other in self.world.all(kind):
                    if other.namespace == entry.namespace or entry.namespace is None:
                        self.cycle.nudge(kind, other.key)

    def forget(self, kind: str, body: JsonDict) -> None:
        meta = body.get("metadata") or {}
        key = (meta.get("namespace"), str(meta.get("name")))
        self.world.remove(kind, key)
        if kind == KIND_PD_CLUSTER:
            self.pd.forget(key)
        self._nudge_dependents(Entry(kind, body))

    async def pd_deleted(self, body: JsonDict) -> None:
        """The finalizer's work: remove what the operator owns (the router ConfigMap), then forget."""
        meta = body.get("metadata") or {}
        ns, name = str(meta.get("namespace") or "default"), str(meta["name"])
        removed = await self.publisher.delete(ns, name)
        logger(KIND_PD_CLUSTER, ns, name).info("deleted", router_config_removed=removed)
        self.forget(KIND_PD_CLUSTER, body)

    def on_leadership(self, leader: bool) -> None:
        self.metrics.leader.set(1 if leader else 0)
        if leader:
            self.cycle.nudge_all()

    async def start(self) -> None:
        if self.config.metrics_port:
            self.metrics.serve(self.config.metrics_port, self.config.metrics_host)
        self.tasks = [
            asyncio.create_task(self.leader.run(self.stop), name="prfaas-lease"),
            asyncio.create_task(self.cycle.run(self.stop), name="prfaas-cycle"),
        ]

    async def shutdown(self) -> None:
        self.stop.set()
        self.cycle.wake.set()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, timeout=10)
        await self.leader.release()
        await self.api.aclose()
        self.metrics.stop()


def connection_info(creds: KubeCredentials) -> kopf.ConnectionInfo:
    return kopf.ConnectionInfo(
        server=creds.server,
        ca_path=creds.ca_path,
        insecure=creds.insecure,
        token=creds.bearer(),
        scheme="Bearer" if creds.bearer() else None,
        certificate_path=creds.cert_path,
        private_key_path=creds.key_path,
        default_namespace=creds.default_namespace,
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
    writer = StatusWriter(api, world)
    publisher = RouterConfigPublisher(api)
    pd = PDClusterReconciler(api, world, writer, KubeActuator(api, world), publisher, metrics, config.prometheus_url)
    prefill = PrefillClusterReconciler(api, world, writer, metrics, config.prometheus_url)
    link = LinkReconciler(api, world, writer, metrics, config.prometheus_url, pd.inputs_for)
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
    settings.batching.worker_limit = 32


async def run_operator(config: OperatorConfig, stop_flag: Any = None, ready_flag: Any = None) -> None:
    from . import handlers

    configure(config.log_level)
    registry = kopf.OperatorRegistry()
    handlers.register(registry)
    memo = kopf.Memo()
    memo["config"] = config
    await kopf.operator(
        registry=registry,
        memo=memo,
        standalone=True,
        clusterwide=config.all_namespaces,
        namespaces=list(config.namespaces),
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


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
