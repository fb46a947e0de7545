"""PrefillCluster reconcile, by mode (ARCHITECTURE.md, "Two regions, two API servers").

*Managed* (this region runs it): ready instances from its workload's status, queue depth from Prometheus.
*Remote* (another region runs it): the remote prefill gateway's status endpoint (GET, bearer token and CA
from the referenced Secrets), parsed as the core's :class:`~prfaas_core.api.GatewayStatus`. An unreachable
gateway turns the object ``Ready=False`` and ``Degraded``; PD clusters then plan with its declared size.
"""

from __future__ import annotations

import base64
import ssl
import time
from typing import Any

import httpx
from pydantic import ValidationError

from prfaas_core.api import GatewayStatus, PrefillCluster
from prfaas_core.names import KIND_MODEL_PROFILE, KIND_PREFILL_CLUSTER

from .actuate import workload_path
from .kube import ApiError, JsonDict, KubeApi, api_path
from .logs import logger
from .metrics import OperatorMetrics
from .observe import Snapshot
from .registry import Entry, World
from .status import get_condition, iso, post_event, set_condition
from .writer import StatusWriter


class GatewayError(Exception):
    pass


async def _secret_value(api: KubeApi, namespace: str, name: str, key: str) -> str:
    secret = await api.get(api_path("v1", "secrets", namespace, name))
    if secret is None:
        raise GatewayError(f"Secret {name!r} not found")
    if key in (secret.get("data") or {}):
        return base64.b64decode(secret["data"][key]).decode()
    if key in (secret.get("stringData") or {}):
        return str(secret["stringData"][key])
    raise GatewayError(f"Secret {name!r} has no key {key!r}")


async def fetch_gateway_status(api: KubeApi, pfc: PrefillCluster, timeout_s: float = 5.0) -> GatewayStatus:
    ep = pfc.spec.endpoint
    assert ep is not None  # the spec's CEL rule for Remote
    namespace = pfc.metadata.namespace or "default"
    headers = {"Accept": "application/json"}
    verify: ssl.SSLContext | bool = True
    if ep.token_secret_ref is not None:
        token = await _secret_value(api, namespace, ep.token_secret_ref.name, ep.token_secret_ref.key)
        headers["Authorization"] = f"Bearer {token.strip()}"
    if ep.tls_secret_ref is not None:
        verify = ssl.create_default_context(
            cadata=await _secret_value(api, namespace, ep.tls_secret_ref.name, "ca.crt")
        )
    url = ep.url.rstrip("/") + ep.status_path
    try:
        async with httpx.AsyncClient(verify=verify, timeout=timeout_s) as client:
            resp = await client.get(url, headers=headers)
    except httpx.HTTPError as exc:
        raise GatewayError(f"GET {url}: {type(exc).__name__}: {exc}") from exc
    if resp.status_code != 200:
        raise GatewayError(f"GET {url}: HTTP {resp.status_code}")
    try:
        return GatewayStatus.model_validate_json(resp.content)
    except ValidationError as exc:
        raise GatewayError(f"GET {url}: not a GatewayStatus: {exc.errors(include_url=False)[:2]}") from exc


class PrefillClusterReconciler:
    def __init__(
        self, api: KubeApi, world: World, writer: StatusWriter, metrics: OperatorMetrics, default_prometheus_url: str
    ) -> None:
        self.api = api
        self.world = world
        self.writer = writer
        self.metrics = metrics
        self.default_prometheus_url = default_prometheus_url
        self.next_due: dict[tuple[str | None, str], float] = {}

    async def reconcile(self, entry: Entry, snap: Snapshot | None, now_s: float, sync: bool) -> None:
        started = time.perf_counter()
        try:
            await self._reconcile(entry, snap, now_s, sync)
        finally:
            self.metrics.reconcile_seconds.labels(kind=KIND_PREFILL_CLUSTER).observe(time.perf_counter() - started)

    async def _reconcile(self, entry: Entry, snap: Snapshot | None, now_s: float, sync: bool) -> None:
        log = logger(KIND_PREFILL_CLUSTER, entry.namespace, entry.name)
        gen = entry.generation
        conds: list[JsonDict] = list(entry.status.get("conditions") or [])
        if entry.paused:
            conds = set_condition(conds, "Paused", True, "PausedByAnnotation", "reconciliation is paused", now_s, gen)
            await self.writer.write(entry, {"conditions": conds})
            return
        old = get_condition(conds, "Ready") or {}
        problem: tuple[str, str] | None = None
        if not entry.valid:
            problem = ("InvalidSpec", "; ".join(entry.problems))
        elif self.world.get(KIND_MODEL_PROFILE, None, entry.model.spec.model_profile_ref.name) is None:
            ref = entry.model.spec.model_profile_ref.name
            problem = ("DanglingReference", f"spec.modelProfileRef: ModelProfile {ref!r} not found")
        if problem is not None:
            conds = set_condition(conds, "Ready", False, *problem, now_s, gen)
            await self.writer.write(entry, {"observedGeneration": gen, "conditions": conds})
            if old.get("reason") != problem[0] or old.get("message") != problem[1]:
                log.warning("not ready", reason=problem[0], message=problem[1])
                await post_event(self.api, entry.body, "Warning", *problem, now_s)
            return
        if not sync:
            if old.get("reason") in ("InvalidSpec", "DanglingReference"):
                conds = set_condition(
                    conds, "Ready", "Unknown", "Syncing", "references resolved; status syncing", now_s, gen
                )
            await self.writer.write(entry, {"observedGeneration": gen, "conditions": conds})
            return
        pfc: PrefillCluster = entry.model
        status: dict[str, Any] = {"observedGeneration": gen}
        if pfc.spec.mode == "Remote":
            try:
                gw = await fetch_gateway_status(self.api, pfc)
            except (GatewayError, ApiError) as exc:
                message = str(exc)
                conds = set_condition(conds, "Ready", False, "GatewayUnreachable", message, now_s, gen)
                conds = set_condition(conds, "Degraded", True, "GatewayUnreachable", message, now_s, gen)
                status["conditions"] = conds
                await self.writer.write(entry, status)
                if old.get("reason") != "GatewayUnreachable":
                    log.warning("gateway unreachable", message=message)
                    await post_event(self.api, entry.body, "Warning", "GatewayUnreachable", message, now_s)
                return
            status.update(
                readyInstances=gw.ready_instances,
                queueDepth=gw.queue_depth,
                measuredPrefillTokensPerSecond=gw.measured_prefill_tokens_per_second,
                egressGbps=gw.egress_gbps,
                lastSyncTime=iso(now_s),
            )
            conds = set_condition(
                conds, "Ready", True, "GatewaySynced", f"status from the gateway at {gw.time}", now_s, gen
            )
        else:
            assert pfc.spec.workload is not None
            workload = await self.api.get(workload_path(pfc.spec.workload, entry.namespace or "default"))
            if workload is None:
                message = f"spec.workload: {pfc.spec.workload.kind} {pfc.spec.workload.name!r} not found"
                conds = set_condition(conds, "Ready", False, "WorkloadMissing", message, now_s, gen)
                status["conditions"] = conds
                await self.writer.write(entry, status)
                return
            ready = int((workload.get("status") or {}).get("readyReplicas") or 0)
            status.update(readyInstances=ready, lastSyncTime=iso(now_s))
            if snap is not None:
                queue = snap.prefill_queue.get((entry.namespace or "", entry.name))
                if queue is not None:
                    status["queueDepth"] = queue
            conds = set_condition(
                conds,
                "Ready",
                ready > 0,
                "InstancesReady" if ready else "NoReadyInstances",
                f"{ready} of {pfc.spec.instances} instances ready",
                now_s,
                gen,
            )
        conds = set_condition(conds, "Degraded", False, "Synced", "status refreshed this cycle", now_s, gen)
        status["conditions"] = conds
        await self.writer.write(entry, status)
