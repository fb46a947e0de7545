"""Abandoned KV: a decode leg failed after its prefill produced a KV handle, so no decode will pull it.

vLLM 0.32's NixlConnector holds a prefill's blocks under a lease (``kv_lease_duration``, 30 s by default,
extended by the heartbeats of a decode that waits for them) and frees them when a decode's read completes or
the lease runs out. A producer cannot be told to free them directly, but a consumer can: a decode request that
carries the handle and is rejected by the consumer's serving layer
before it is scheduled makes the consumer send the producer the notification-only read of a full prefix hit
(``notify_kv_transfer_request_rejected``), and the producer frees the blocks at once, moving none.

So the router sends a *release leg* to a healthy decode instance (another one than the failed decode first):
the handle with a body every consumer rejects — a model name nobody serves (vLLM: 404 from its model check)
and ``max_tokens: 0`` (the engine emulator: 400) — and counts it released when it is rejected. When no consumer
can take it (the only decode is dead), the handle waits out the producer's lease; either way it is counted
(``prfaas_router_abandoned_kv_handles_total``, ``prfaas_router_released_kv_handles_total``) and logged.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import structlog

from prfaas_core import names

from .http_util import JSON_CONTENT, json_bytes
from .leg_host import LegHost, remote_auth
from .legs import ENGINE
from .runtime import EngineLoad
from .security import RequestIds

log = structlog.get_logger("prfaas.router")

PULL_REPORT_TIMEOUT_S = 5.0
RELEASE_MODEL = ENGINE.RELEASE_MODEL
RELEASE_TIMEOUT_S = 5.0
_pending: set[asyncio.Task[None]] = set()


release_body = ENGINE.release_body


def consumers(proxy: LegHost, failed: str) -> list[str]:
    """Healthy instances that can decode (and so can notify a producer), the failed decode last."""
    c, engines = proxy.rt.compiled, proxy.rt.snapshot.engines
    healthy = [e.name for e in (*c.decode, *c.both) if engines.get(e.name, EngineLoad()).healthy]
    return sorted(healthy, key=lambda name: name == failed)


def abandon(proxy: LegHost, kv: dict[str, Any], cluster: str, failed: str, request_id: RequestIds, error: str) -> None:
    """Count the abandoned handle and release it in the background (the client's answer does not wait)."""
    proxy.metrics.abandoned_kv.labels(cluster).inc()
    leg = _release(proxy, kv, cluster, consumers(proxy, failed), request_id, error)
    task = asyncio.get_running_loop().create_task(leg)
    _pending.add(task)
    task.add_done_callback(_pending.discard)


async def _release(
    proxy: LegHost, kv: dict[str, Any], cluster: str, candidates: list[str], request_id: RequestIds, error: str
) -> None:
    by_name = proxy.rt.compiled.by_name
    for name in candidates[:2]:
        endpoint = by_name.get(name)
        if endpoint is None or proxy.session is None:
            continue
        try:
            async with proxy.legs.post(
                f"{endpoint.url}/v1/completions",
                data=json_bytes(release_body(kv)),
                headers={"x-request-id": request_id.trace, "Content-Type": JSON_CONTENT},
                timeout=aiohttp.ClientTimeout(total=RELEASE_TIMEOUT_S),
            ) as resp:
                await resp.read()
                rejected = 400 <= resp.status < 500
        except (aiohttp.ClientError, TimeoutError):
            continue
        if rejected:
            proxy.metrics.released_kv.labels(cluster).inc()
            log.warning(
                "decode failed after prefill; its KV released",
                request_id=request_id.trace,
                cluster=cluster,
                via=name,
                error=error,
            )
            return
    log.warning(
        "decode failed after prefill; no decode instance could release its KV, it is left to expire",
        request_id=request_id.trace,
        cluster=cluster,
        error=error,
    )


def report_pull_over(proxy: LegHost, key: str) -> None:
    """The request ``key``'s pull is over (its decode holds the KV, or the decode failed): tell the gateway that
    let it onto the wire, in the background, so that the link's next pull starts (unreported, it waits out the
    pull's lease). Once per pull; nothing when no gateway counts one."""
    pull = proxy.rt.gateway_pulls.pop(key, None)
    if pull is None or proxy.session is None:
        return
    task = asyncio.get_running_loop().create_task(_report(proxy, *pull))
    _pending.add(task)
    task.add_done_callback(_pending.discard)


async def _report(proxy: LegHost, remote_name: str, pull_id: str) -> None:
    remote = next((r for r in proxy.rt.compiled.remotes if r.name == remote_name), None)
    if remote is None:
        return
    try:
        async with proxy.legs.post(
            f"{remote.url}{names.PULL_DONE_PATH.format(pull_id=pull_id)}",
            headers=remote_auth(proxy, remote.name),
            timeout=aiohttp.ClientTimeout(total=PULL_REPORT_TIMEOUT_S),
            ssl=proxy.remote_tls.get(remote.name, True),
        ) as resp:
            await resp.read()
            if resp.status != 200:
                log.warning("the gateway did not take a pull's report", remote=remote.name, status=resp.status)
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("could not report a pull over; it waits out its lease", remote=remote.name, error=str(exc))
