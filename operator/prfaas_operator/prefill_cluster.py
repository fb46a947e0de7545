"""PrefillCluster reconcile, by mode (ARCHITECTURE.md, "Two regions, two API servers").

*Managed* (this region runs it): its instances are the pods labelled ``prfaas.io/prefill-cluster=<name>``
(label the pod that serves HTTP: with a LeaderWorkerSet, the leader template). Ready instances come from those
pods, queue depth from Prometheus, and the operator publishes the prefill gateway's RouterConfig
(``<name>-gateway-config``) listing them, on every reconcile (pod events nudge it; unchanged content is not
rewritten). The ConfigMap is owned by the PrefillCluster, and a finalizer removes it on deletion (handlers.py).
*Remote* (another region runs it): the remote prefill gateway's status endpoint (GET, bearer token and CA
from the referenced Secrets), parsed as the core's :class:`~prfaas_core.api.GatewayStatus`. An unreachable
gateway turns the object ``Ready=False`` and ``Degraded``; PD clusters then plan with its declared size.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from typing import Any

import httpx
from pydantic import ValidationError

from prfaas_core.api import Condition, GatewayStatus, PrefillCluster, PrefillClusterStatus
from prfaas_core.names import (
    KIND_MODEL_PROFILE,
    KIND_PREFILL_CLUSTER,
    LABEL_DRAINING,
    LABEL_PREFILL_CLUSTER,
)

from .actuate import workload_path
from .elastic import ElasticScaler, SizeRequest, removed
from .elastic_demand import site_load_demand
from .fleet import site_cap, site_conditions, site_links
from .kube import ApiError, JsonDict, KubeApi, api_path
from .logs import logger
from .metrics import OperatorMetrics
from .observe import Snapshot
from .pacing import paced_gbps, pacing_patch
from .pd_refs import LinkIndex
from .pods import pod_ready
from .registry import Entry, World
from .router_config import RouterConfigPublisher, build_gateway
from .status import changed_reason, get_condition, iso, post_event, set_condition
from .writer import StatusWriter


class GatewayError(Exception):
    pass


class Secrets:
    """Secret values for the gateway reads, each Secret read at most once per tick (``now_s``, read once per
    tick and passed down): a fleet's Remote PrefillClusters share a token and a CA Secret or a few, and one GET
    per PrefillCluster per Secret per cycle was most of the operator's API calls at a thousand of them. A
    rotated Secret is seen at the next tick. Concurrent readers of one Secret in a tick share one request."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self._tick: float | None = None
        self._reads: dict[tuple[str, str], asyncio.Task[JsonDict | None]] = {}

    async def value(self, namespace: str, name: str, key: str, now_s: float) -> str:
        if now_s != self._tick:
            self._tick, self._reads = now_s, {}
        read = self._reads.get((namespace, name))
        if read is None:
            read = self._reads[(namespace, name)] = asyncio.ensure_future(
                self.api.get(api_path("v1", "secrets", namespace, name))
            )
        secret = await asyncio.shield(read)  # one reader cancelled does not cancel the others' read
        if secret is None:
            raise GatewayError(f"Secret {name!r} not found")
        if key in (secret.get("data") or {}):
            return base64.b64decode(secret["data"][key]).decode()
        if key in (secret.get("stringData") or {}):
            return str(secret["stringData"][key])
        raise GatewayError(f"Secret {name!r} has no key {key!r}")


class GatewayClients:
    """One long-lived HTTP client per CA bundle (the system store or a Secret's ``ca.crt``).

    Building a TLS context loads the CA bundle, tens of milliseconds of CPU; a fresh client per gateway read
    made that the operator's largest cost at a thousand PrefillClusters. Connections are kept alive too.
    """

    def __init__(self, timeout_s: float = 5.0) -> None:
        self.timeout_s = timeout_s
        self._clients: dict[str | None, httpx.AsyncClient] = {}

    def get(self, ca_pem: str | None) -> httpx.AsyncClient:
        client = self._clients.get(ca_pem)
        if client is None:
            verify: ssl.SSLContext | bool = True if ca_pem is None else ssl.create_default_context(cadata=ca_pem)
            client = self._clients[ca_pem] = httpx.AsyncClient(verify=verify, timeout=self.timeout_s)
        return client

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()


async def fetch_gateway_status(
    secrets: Secrets, pfc: PrefillCluster, clients: GatewayClients, now_s: float
) -> GatewayStatus:
    ep = pfc.spec.endpoint
    assert ep is not None  # the spec's CEL rule for Remote
    namespace = pfc.metadata.namespace or "default"
    headers = {"Accept": "application/json"}
    ca_pem: str | None = None
    if ep.token_secret_ref is not None:
        token = await secrets.value(namespace, ep.token_secret_ref.name, ep.token_secret_ref.key, now_s)
        headers["Authorization"] = f"Bearer {token.strip()}"
    if ep.tls_secret_ref is not None:
        ca_pem = await secrets.value(namespace, ep.tls_secret_ref.name, "ca.crt", now_s)
    url = ep.url.rstrip("/") + ep.status_path
    try:
        resp = await clients.get(ca_pem).get(url, headers=headers)
    except (httpx.HTTPError, ssl.SSLError) as exc:
        raise GatewayError(f"GET {url}: {type(exc).__name__}: {exc}") from exc
    if resp.status_code != 200:
        raise GatewayError(f"GET {url}: HTTP {resp.status_code}")
    try:
        return GatewayStatus.model_validate_json(resp.content)
    except ValidationError as exc:
        raise GatewayError(f"GET {url}: not a GatewayStatus: {exc.errors(include_url=False)[:2]}") from exc


def draining(pod: JsonDict) -> bool:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_DRAINING) == "true"


def is_managed(body: JsonDict) -> bool:
    """Managed unless the spec says Remote (the CRD defaults ``mode`` to Managed; the emulator does not)."""
    return ((body.get("spec") or {}).get("mode") or "Managed") == "Managed"


class PrefillClusterReconciler:
    def __init__(
        self,
        api: KubeApi,
        world: World,
        writer: StatusWriter,
        metrics: OperatorMetrics,
        default_prometheus_url: str,
        publisher: RouterConfigPublisher | None = None,
        scaler: ElasticScaler | None = None,
        links: LinkIndex | None = None,
    ) -> None:
        self.api = api
        self.world = world
        self.writer = writer
        self.metrics = metrics
        self.default_prometheus_url = default_prometheus_url
        self.publisher = publisher or RouterConfigPublisher(api)
        self.scaler = scaler or ElasticScaler(api, world, metrics)
        self.links = links or LinkIndex(world)
        """The links by the site they name (built once per cycle by the cycle; a scan of every link per
        PrefillCluster made a cycle over N of them O(N^2))."""
        self.next_due: dict[tuple[str | None, str], float] = {}
        self.gateways = GatewayClients()
        self.secrets = Secrets(api)
        self._remote_seen: set[tuple[str | None, str]] = set()
        """Remote PrefillClusters whose (possible) Managed-mode gateway ConfigMap was removed since start."""

    async def reconcile(self, entry: Entry, snap: Snapshot | None, now_s: float, sync: bool) -> None:
        with self.metrics.reconcile_timer(KIND_PREFILL_CLUSTER):
            await self._reconcile(entry, snap, now_s, sync)

    async def _reconcile(self, entry: Entry, snap: Snapshot | None, now_s: float, sync: bool) -> None:
        log = logger(KIND_PREFILL_CLUSTER, entry.namespace, entry.name)
        gen = entry.generation
        conds = entry.read_status(PrefillClusterStatus).conditions
        if entry.paused:
            await self.writer.write_paused(entry, PrefillClusterStatus, conds, now_s)
            return
        old = get_condition(conds, "Ready")
        problem: tuple[str, str] | None = None
        if not entry.valid:
            problem = ("InvalidSpec", "; ".join(entry.problems))
        elif self.world.get(KIND_MODEL_PROFILE, None, entry.model.spec.model_profile_ref.name) is None:
            ref = entry.model.spec.model_profile_ref.name
            problem = ("DanglingReference", f"spec.modelProfileRef: ModelProfile {ref!r} not found")
        if problem is not None:
            conds = set_condition(conds, "Ready", False, *problem, now_s, gen)
            await self.writer.write(entry, PrefillClusterStatus(observed_generation=gen, conditions=conds))
            if changed_reason(old, *problem):
                log.warning("not ready", reason=problem[0], message=problem[1])
                await post_event(self.api, entry.body, "Warning", *problem, now_s)
            return
        pfc: PrefillCluster = entry.model
        pods = [p for p in self.world.pods_of(entry.namespace, LABEL_PREFILL_CLUSTER, entry.name) if not removed(p)]
        if pfc.spec.mode == "Managed":
            self._remote_seen.discard((entry.namespace, entry.name))
            await self._publish_gateway(entry, pfc, pods)
        else:
            await self._retire_gateway(entry)
        site, conds = await self._site(entry, pfc, conds, now_s)
        if not sync:
            if old is not None and old.reason in ("InvalidSpec", "DanglingReference"):
                conds = set_condition(
                    conds, "Ready", "Unknown", "Syncing", "references resolved; status syncing", now_s, gen
                )
            await self.writer.write(entry, PrefillClusterStatus(observed_generation=gen, **site, conditions=conds))
            return
        status: dict[str, Any] = {"observed_generation": gen, **site}
        if pfc.spec.mode == "Remote":
            try:
                gw = await fetch_gateway_status(self.secrets, pfc, self.gateways, now_s)
            except (GatewayError, ApiError) as exc:
                message = str(exc)
                conds = set_condition(conds, "Ready", False, "GatewayUnreachable", message, now_s, gen)
                conds = set_condition(conds, "Degraded", True, "GatewayUnreachable", message, now_s, gen)
                await self.writer.write(entry, PrefillClusterStatus(**status, conditions=conds))
                if old is None or old.reason != "GatewayUnreachable":
                    log.warning("gateway unreachable", message=message)
                    await post_event(self.api, entry.body, "Warning", "GatewayUnreachable", message, now_s)
                return
            status.update(
                ready_instances=gw.ready_instances,
                queue_depth=gw.queue_depth,
                measured_prefill_tokens_per_second=gw.measured_prefill_tokens_per_second,
                egress_gbps=gw.egress_gbps,
                last_sync_time=iso(now_s),
            )
            conds = set_condition(
                conds,
                "Ready",
                True,
                "GatewaySynced",
                f"status synced from the gateway ({gw.ready_instances} instances ready)",
                now_s,
                gen,
            )
        else:
            assert pfc.spec.workload is not None
            workload = await self.api.get(workload_path(pfc.spec.workload, entry.namespace or "default"))
            if workload is None:
                message = f"spec.workload: {pfc.spec.workload.kind} {pfc.spec.workload.name!r} not found"
                conds = set_condition(conds, "Ready", False, "WorkloadMissing", message, now_s, gen)
                await self.writer.write(entry, PrefillClusterStatus(**status, conditions=conds))
                return
            await self._pace_egress(entry, pfc, workload, now_s)
            ready = sum(1 for p in pods if pod_ready(p) and not draining(p))
            status.update(
                ready_instances=ready,
                replicas=ready,
                selector=f"{LABEL_PREFILL_CLUSTER}={entry.name}",
                last_sync_time=iso(now_s),
            )
            if snap is not None:
                queue = snap.prefill_queue.get((entry.namespace or "", entry.name))
                if queue is not None:
                    status["queue_depth"] = float(queue)
            sized = await self._size(entry, pfc, pods, snap, now_s)
            if sized is not None:
                status["scaling"] = sized
            elif pfc.spec.scaling.mode == "Fixed":
                status["scaling"] = None  # back to Fixed: the old sizing goes (absent already: no write)
            conds = set_condition(
                conds,
                "Ready",
                ready > 0,
                "InstancesReady" if ready else "NoReadyInstances",
                f"{ready} of {pfc.spec.instances} instances ready"
                + ("" if pods else f" (no pods labelled {LABEL_PREFILL_CLUSTER}={entry.name})"),
                now_s,
                gen,
            )
        conds = set_condition(conds, "Degraded", False, "Synced", "status refreshed this cycle", now_s, gen)
        await self.writer.write(entry, PrefillClusterStatus(**status, conditions=conds))

    async def _site(
        self, entry: Entry, pfc: PrefillCluster, conds: list[Condition], now_s: float
    ) -> tuple[dict[str, Any], list[Condition]]:
        """The site's links known here, its egress cap against them, and its Drained and SiteCapBinding
        conditions (:mod:`.fleet`); a change of either posts an Event."""
        here = [e.model for e in self.links.links_of_site(entry.namespace, entry.name)]
        links = site_links(pfc, here)
        cap = site_cap(pfc, links)
        conds, events = site_conditions(conds, pfc, links, cap, now_s, entry.generation)
        for reason, message in events:
            logger(KIND_PREFILL_CLUSTER, entry.namespace, entry.name).info("site", reason=reason, message=message)
            await post_event(self.api, entry.body, "Normal", reason, message, now_s)
        return {"links": links, "site_cap": cap}, conds

    async def _size(
        self, entry: Entry, pfc: PrefillCluster, pods: list[JsonDict], snap: Snapshot | None, now_s: float
    ) -> Any:
        """Elastic capacity (:mod:`.elastic`): the site sized from what its gateway's engines report; a failed
        write is logged and retried next sync, it never blocks the status."""
        if pfc.spec.scaling.mode == "Fixed" or pfc.spec.workload is None:
            return None
        profile = self.world.get(KIND_MODEL_PROFILE, None, pfc.spec.model_profile_ref.name)
        demand, link_cost = site_load_demand(entry, pfc, profile, snap, self.default_prometheus_url)
        ns = entry.namespace or ""
        req = SizeRequest(
            entry=entry,
            scaling=pfc.spec.scaling,
            declared=pfc.spec.instances,
            workload=pfc.spec.workload,
            pods=pods,
            in_flight=(snap.prefill_in_flight.get((ns, entry.name), {}) if snap else {}),
            demand=demand,
            price_per_instance_hour=pfc.spec.hardware.price_per_instance_hour,
            labels={"namespace": ns or "default", "pd_cluster": "", "prefill_cluster": entry.name, "role": "prefill"},
            old=entry.read_status(PrefillClusterStatus).scaling,
            fixed_cost_per_hour=link_cost,
        )
        try:
            return await self.scaler.size(req, now_s)
        except ApiError as exc:
            logger(KIND_PREFILL_CLUSTER, entry.namespace, entry.name).error("scaling not carried out", error=str(exc))
            return None

    async def _pace_egress(self, entry: Entry, pfc: PrefillCluster, workload: JsonDict, now_s: float) -> None:
        """The workload's pod templates to ``linkScheduling.egressPacing`` (:mod:`.pacing`); a failed write is
        logged and retried at the next sync, it never blocks the status."""
        assert pfc.spec.workload is not None
        change = pacing_patch(workload, paced_gbps(pfc))
        if change is None:
            return
        patch, what = change
        log = logger(KIND_PREFILL_CLUSTER, entry.namespace, entry.name)
        try:
            await self.api.patch(workload_path(pfc.spec.workload, entry.namespace or "default"), patch)
        except ApiError as exc:
            log.error("egress pacing not written", workload=pfc.spec.workload.name, error=str(exc))
            return
        log.info("egress pacing written", workload=pfc.spec.workload.name, change=what)
        message = f"{pfc.spec.workload.kind} {pfc.spec.workload.name}: {what}; its pods restart to take it"
        await post_event(self.api, entry.body, "Normal", "EgressPacing", message, now_s)

    async def _retire_gateway(self, entry: Entry) -> None:
        """A Remote PrefillCluster has no gateway here: the ConfigMap a Managed spec had published is removed
        (once per mode change, and once after an operator start, since a restart forgets what was written)."""
        key = (entry.namespace, entry.name)
        if key in self._remote_seen:
            return
        try:
            if await self.publisher.delete_gateway(entry.namespace or "default", entry.name):
                logger(KIND_PREFILL_CLUSTER, entry.namespace, entry.name).info("old gateway config removed")
        except ApiError as exc:
            logger(KIND_PREFILL_CLUSTER, entry.namespace, entry.name).error(
                "old gateway config not removed", error=str(exc)
            )
            return
        self._remote_seen.add(key)

    async def _publish_gateway(self, entry: Entry, pfc: PrefillCluster, pods: list[JsonDict]) -> None:
        """The gateway's RouterConfig from the cache (references already resolved); a failed write is logged and
        retried at the next reconcile, it never blocks the status."""
        profile = self.world.get(KIND_MODEL_PROFILE, None, pfc.spec.model_profile_ref.name)
        if profile is None or not profile.valid:
            return
        try:
            await self.publisher.publish_gateway(entry.body, build_gateway(pfc, pods, profile.model.spec))
        except ApiError as exc:
            logger(KIND_PREFILL_CLUSTER, entry.namespace, entry.name).error(
                "gateway config not published", error=str(exc)
            )
