"""One retry of a failed local prefill leg, before decode (never after: decode has not started).

A local prefill leg that failed on the engine's side (5xx, a refused or reset connection, a timeout) is tried
once more: on another PD prefill instance when the short-term policy picks one with the failed instance left
out, else on the remote PrFaaS cluster when it is usable (the policy's "no local prefill" route). A 4xx is the
client's fault and is not retried. Each retry counts in ``prfaas_router_prefill_retries_total{to, outcome}``
and logs one line with its cause.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import structlog

from prfaas_core.api import RemoteGateway

from . import prefill_legs
from .leg_host import LegHost
from .legs import LegError
from .link_wait import LinkDeclined
from .runtime import LocalPlan
from .security import RequestIds

log = structlog.get_logger("prfaas.router")

RETRY_ROUTE = "retry"
"""The route label (and ``x-prfaas-route``) of a request whose prefill leg was retried."""


@dataclass(frozen=True)
class Prefilled:
    kv: dict[str, Any]
    plan: LocalPlan
    route: str
    remote: RemoteGateway | None
    """The remote that prefilled it on the retry (its KV crosses the link), None when local."""


async def prefill_with_retry(
    proxy: LegHost,
    plan: LocalPlan,
    route: str,
    path: str,
    body: dict[str, Any],
    request_id: RequestIds,
    uncached: int,
    total_tokens: int,
    hashes: list[bytes],
    pd_hits: dict[str, int],
) -> Prefilled:
    """The local prefill leg, and once more elsewhere if it failed retriably; LegError when both failed."""
    try:
        return Prefilled(
            await prefill_legs.local_prefill(proxy, plan, path, body, request_id, uncached), plan, route, None
        )
    except LegError as exc:
        if exc.status < 500 or plan.prefill is None:
            raise
        first = exc
    rt, m = proxy.rt, proxy.metrics
    failed = plan.prefill
    routed = rt.route(total_tokens, hashes, pd_hits, exclude=frozenset({failed}))
    remote = rt.remote_gateway(routed)
    again = rt.local_plan(routed)
    if again is None or (remote is None and again.prefill is None):
        m.prefill_retries.labels("none", "unavailable").inc()
        log.warning(
            "prefill failed; no other instance to retry on",
            request_id=request_id.trace,
            instance=failed,
            error=str(first),
        )
        raise first
    target = "remote" if remote is not None else "local"
    log.warning(
        "prefill failed; retrying once",
        request_id=request_id.trace,
        instance=failed,
        error=str(first),
        retry_on=remote.name if remote is not None else again.prefill,
    )
    try:
        if remote is not None:
            d = routed.decision
            kv = await prefill_legs.remote_prefill(
                proxy, remote, path, body, request_id, d.transfer_bytes, d.uncached_tokens, probe=routed.probe
            )
        else:
            kv = await prefill_legs.local_prefill(proxy, again, path, body, request_id, routed.decision.uncached_tokens)
    except (LegError, LinkDeclined) as exc:
        m.prefill_retries.labels(target, "error").inc()
        status = exc.status if isinstance(exc, LegError) else 503
        raise LegError(f"{first}; retry on {target} failed too: {exc}", status=status) from None
    m.prefill_retries.labels(target, "ok").inc()
    return Prefilled(kv, again, RETRY_ROUTE, remote)
