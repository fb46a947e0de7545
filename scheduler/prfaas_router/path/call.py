"""The per-request side of the request path: the :class:`Call` (one per client request, its outcome counted
once), its local plan, what the legs need of the proxy (:class:`LegHost`), the release of a KV no decode will
pull, the pull's report to the gateway, the per-request TTFT limit, and the decode leg's answer to the client,
whole or streamed (a break mid-stream ends it with an error event)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import ssl
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import structlog
from aiohttp import web

from prfaas_core import names
from prfaas_core.api import RemoteGateway
from prfaas_core.api.common import SloSpec
from prfaas_core.policy.engine_load import IDLE
from prfaas_core.policy.short_term import RoutePlan

from ..state.metrics import FAILURE_KINDS, RouterMetrics, judge_ttft
from ..state.runtime import Runtime
from ..state.security import RequestIds
from ..state.wire import (
    ENGINE,
    JSON_CONTENT,
    Aborts,
    LegError,
    LegSession,
    json_bytes,
    json_error,
    timing_entry,
    timing_prefixed,
)

# --- The per-request object


@dataclass(frozen=True)
class LocalPlan:
    prefill: str | None
    """Prefill instance (None: one instance does both, or none can: ``no_prefill``)."""
    decode: str
    no_prefill: str | None = None
    """Why no local prefill instance can take it (the remote must prefill it), None when one can."""


def local_plan(rt: Runtime, plan: RoutePlan) -> LocalPlan | None:
    """Prefill and decode instances for a local request (cache-affine prefill, least-loaded decode)."""
    decode = plan.decode
    if decode is None or decode.name is None:
        return None
    if plan.prefill is None:
        return LocalPlan(None, decode.name)
    if plan.prefill.name is None:
        if rt.compiled.both:
            return LocalPlan(None, decode.name)
        return LocalPlan(None, decode.name, plan.prefill.reason)
    return LocalPlan(plan.prefill.name, decode.name)


def plan_local(
    rt: Runtime, total_tokens: int, hashes: list[bytes], pd_hits: dict[str, int] | None = None
) -> LocalPlan | None:
    """A fresh local plan from the configuration and the snapshot in force now."""
    return local_plan(rt, rt.route(total_tokens, hashes, pd_hits))


@dataclass
class Call:
    """One client request on the router's path, from its parse to its answer: its ids (the ledger keys its KV
    stream on :attr:`key`), its prompt and prefix lookups, the breaker probe ticket it holds, the gateway's timing
    and pull id once a remote prefilled it, and its outcome, counted exactly once (:meth:`report`) whichever
    way the request ends. The long-lived state stays the :class:`~prfaas_router.state.runtime.Runtime`'s."""

    ids: RequestIds
    metrics: RouterMetrics
    path: str
    body: dict[str, Any]
    prompt_tokens: int
    started: float
    """When the request arrived (perf_counter)."""
    hashes: list[bytes] = field(default_factory=list)
    """The prompt's block hashes (the prefix indexes' keys)."""
    prompt_ids: Sequence[int] = ()
    """The prompt's token ids (what the decode instances are learned to hold)."""
    decode_cached: int = 0
    """Leading prompt tokens its decode instance holds already: a remote prefill's KV bytes leave them out."""
    pd_hits: dict[str, int] = field(default_factory=dict)
    """The PD prefix index's hits (tokens) per instance, as looked up once."""
    probe: float | None = None
    """The breaker's probe ticket for the remote it was routed to (freed if the call ends without a verdict)."""
    gateway_timing: str = ""
    """The gateway's ``Server-Timing`` of its remote prefill, passed on in the router's answer."""
    pull: tuple[str, str] | None = None
    """(remote, the gateway's pull id): a pull the gateway let onto the wire, reported over once
    (:func:`report_pull_over`)."""
    route: str = "none"
    """Its route as it stands (``local``, ``remote``, ``fallback``, ``retry``; ``none`` before the decision)."""
    remote: RemoteGateway | None = None
    """The remote gateway that prefills it (None: local)."""
    plan: LocalPlan | None = None
    """Its local instances (the decode's, and the prefill's when local), re-picked when stale."""
    kv: dict[str, Any] | None = None
    """The KV handle its prefill leg returned (None: no prefill leg, or not yet)."""
    remote_kv: bool = False
    """The KV crosses the link (a remote prefilled it)."""
    kv_settled: bool = False
    """Its KV handle went to a decode that started, or was released: the call gives up on it no more."""
    prefilled: float | None = None
    """When the prefill leg returned the KV handle (perf_counter)."""
    outcome: str | None = None
    """How it ended (``prfaas_router_requests_total``'s ``outcome``); None while in flight."""

    @property
    def key(self) -> str:
        """The key of its KV stream in the router's ledger (an id the router makes)."""
        return self.ids.key

    @property
    def unsalted_hashes(self) -> list[bytes] | None:
        """The routing's block hashes when no ``cache_salt`` went into them (the decode holdings' own, else None)."""
        return None if self.body.get("cache_salt") else self.hashes

    def report(self, outcome: str, route: str | None = None) -> bool:
        """Count the request's outcome on ``route`` (default: its route as it stands); only the first report
        counts (False for a later one: a stream that answered ``ok`` and is then cancelled while closing stays
        ``ok``)."""
        if self.outcome is not None:
            return False
        self.outcome = outcome
        self.metrics.requests_by(route or self.route, outcome).inc()
        return True

    def refuse(self, outcome: str, status: int, message: str, kind: str, **headers: str) -> web.Response:
        """Count the outcome and answer the client an OpenAI-style error."""
        self.report(outcome)
        return json_error(status, message, kind, **headers)


# --- What the request path's steps outside the proxy (the prefill legs, the one retry, the KV release) need of the
# proxy that runs them. A protocol: they take the proxy without importing it, and the proxy imports them.


class LegHost(Protocol):
    """The proxy as its legs see it (:class:`.proxy.Proxy` satisfies it)."""

    rt: Runtime
    metrics: RouterMetrics
    session: LegSession | None
    remote_tls: dict[str, ssl.SSLContext | bool]
    remote_tokens: dict[str, str | None]
    aborts: Aborts

    @property
    def legs(self) -> LegSession:
        """The open HTTP session of the legs (raises when the proxy's app has not opened it)."""
        ...


def remote_auth(proxy: LegHost, remote: str) -> dict[str, str]:
    """The bearer-token header for a call to ``remote``'s gateway (empty when it has no token)."""
    token = proxy.remote_tokens.get(remote)
    return {"Authorization": f"Bearer {token}"} if token else {}


# --- Abandoned KV: a decode leg failed after its prefill produced a KV handle, so no decode will pull it.

log = structlog.get_logger("prfaas.router")

PULL_REPORT_TIMEOUT_S = 5.0
RELEASE_MODEL = ENGINE.RELEASE_MODEL
RELEASE_TIMEOUT_S = 5.0
_pending: set[asyncio.Task[None]] = set()


release_body = ENGINE.release_body


def consumers(proxy: LegHost, failed: str) -> list[str]:
    """Healthy instances that can decode (and so can notify a producer), the failed decode last."""
    c, engines = proxy.rt.compiled, proxy.rt.snapshot.engines
    healthy = [e.name for e in (*c.decode, *c.both) if engines.get(e.name, IDLE).healthy]
    return sorted(healthy, key=lambda name: name == failed)


def give_up_kv(proxy: LegHost, call: Call, error: str) -> None:
    """The call gives up on its KV handle (no decode started with it): released at once (:func:`abandon`)."""
    if call.kv is None or call.kv_settled or call.plan is None:
        return
    call.kv_settled = True
    abandon(proxy, call.kv, "prfaas" if call.remote_kv else "pd", call.plan.decode, call.ids, error)


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
                headers={**request_id.headers(), "Content-Type": JSON_CONTENT},
                timeout=aiohttp.ClientTimeout(total=RELEASE_TIMEOUT_S),
            ) as resp:
                await resp.read()
                rejected = 400 <= resp.status < 500
        except (aiohttp.ClientError, TimeoutError):
            continue
        if rejected:
            proxy.metrics.released_kv.labels(cluster).inc()
            log.warning(
                "a KV handle given up on (no decode will pull it); its KV released",
                request_id=request_id.trace,
                cluster=cluster,
                via=name,
                error=error,
            )
            return
    log.warning(
        "a KV handle given up on; no decode instance could release its KV, it is left to expire",
        request_id=request_id.trace,
        cluster=cluster,
        error=error,
    )


def report_pull_over(proxy: LegHost, call: Call) -> None:
    """The call's pull is over (its decode holds the KV, the decode failed, or the call ended): tell the gateway
    that let it onto the wire, in the background, so that the link's next pull starts (unreported, it waits out
    the pull's lease). Once per pull; nothing when no gateway counts one."""
    pull, call.pull = call.pull, None
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


# --- Per-request admission: a request whose predicted time to first token on the side it was routed to exceeds
# the limit is answered 429 with ``Retry-After`` at once, before any leg, instead of waiting into its leg's timeout
# (a burst of long requests then backs off instead of timing out).


def over_limit(
    rt: Runtime, plan: RoutePlan, remote: RemoteGateway | None, remote_legs: int = 0
) -> tuple[float, float] | None:
    """(predicted TTFT, limit) in wall seconds when the request should be turned away, else None.
    ``remote_legs``: this router's prefill legs in flight to ``remote`` (a slow remote keeps them there longer
    than the ledger's schedule predicts: they count as work ahead too)."""
    c = rt.compiled
    scale = c.scale.time_scale
    configured = c.config.limits.max_predicted_ttft_seconds
    if remote is not None:
        own = c.prfaas.prefill_seconds(float(plan.decision.uncached_tokens))
        lanes = max(1, rt.remote_lanes(remote.link))
        wait = max(rt.remote_queue_wait_s(remote.link) or 0.0, remote_legs / lanes * own)
        predicted = (wait + own) / scale
        limit = configured if configured is not None else remote.timeout_seconds
    elif plan.prefill is not None and plan.prefill.name is not None:
        predicted = plan.prefill.predicted_s / scale
        limit = configured if configured is not None else c.config.timeouts.prefill_seconds
    else:
        return None
    return (predicted, limit) if predicted > limit else None


def retry_after_s(predicted: float, limit: float) -> int:
    """When the queue ahead should have drained enough (at least a second)."""
    return max(1, math.ceil(predicted - limit))


# --- The decode leg's answer to the client, whole or streamed, and the response headers naming the route

ROUTE_HEADER = "x-prfaas-route"
"""Response header naming the route a request took: local, remote or fallback."""
PROMPT_TOKENS_HEADER = "x-prfaas-prompt-tokens"
"""Response header: the prompt's tokens as the router counted them (the model's tokenizer, or the estimate)."""


@dataclass
class DecodeLeg:
    """One decode leg's context: whom it answers, where it runs, and its upstream response once open."""

    request: web.Request
    instance: str
    body: dict[str, Any]
    route: str
    started: float
    prompt_tokens: int
    prefilled: float | None = None
    """When the prefill leg returned the KV handle (perf_counter; None: no prefill leg)."""
    upstream: aiohttp.ClientResponse | None = None
    first_at: float | None = None
    """When the decode's first bytes arrived."""
    gateway_timing: str = ""
    """The gateway's ``Server-Timing`` for a remote prefill, passed on under ``gw-``."""
    drained: bool = False
    """The upstream was read to its end (it goes back to the pool; any other is closed)."""
    timing: bool = False
    """Send the client ``Server-Timing`` (``security.serverTiming``; off by default: no cache oracle)."""

    def headers(self) -> dict[str, str]:
        out = {ROUTE_HEADER: self.route, PROMPT_TOKENS_HEADER: str(self.prompt_tokens)}
        if not self.timing:
            return out
        phases = (("prefill", self.prefilled), ("first", self.first_at))
        entries = [timing_entry(name, at - self.started) for name, at in phases if at is not None]
        entries += timing_prefixed(self.gateway_timing)
        if entries:
            out[names.SERVER_TIMING] = ", ".join(entries)
        return out

    def close(self) -> None:
        """Release a drained upstream to the pool; close any other, so that the engine sees the disconnect,
        drops the request and frees its KV."""
        if self.upstream is not None:
            if self.drained:
                self.upstream.release()
            else:
                self.upstream.close()


def failure_kind(message: str) -> str:
    """A low-cardinality label for why a remote prefill failed."""
    for key, kind in FAILURE_KINDS:
        if key in message:
            return kind
    return "other"


async def answer_whole(
    m: RouterMetrics,
    call: Call,
    leg: DecodeLeg,
    chunks: AsyncIterator[bytes],
    first: bytes,
    prefilled: float | None,
    slo: SloSpec | None = None,
) -> web.Response:
    """A non-streamed answer: the decode's body read to its end."""
    route = leg.route
    try:
        data = first + b"".join([c async for c in chunks])
    except aiohttp.ClientError as exc:
        raise LegError(
            f"decode on {leg.instance} broke mid-answer: {exc.__class__.__name__}", retriable=False
        ) from None
    leg.drained = True
    if prefilled is not None:
        judge_ttft(m, slo, route, prefilled - leg.started, leg.prompt_tokens)
    m.e2e_by(route).observe(time.perf_counter() - leg.started)
    call.report("ok", route)
    return web.Response(body=data, status=200, content_type="application/json", headers=leg.headers())


async def answer_stream(
    m: RouterMetrics, call: Call, leg: DecodeLeg, chunks: AsyncIterator[bytes], first: bytes, slo: SloSpec | None = None
) -> web.StreamResponse:
    """A streamed answer: the decode's events passed on as they come; a break ends with an error event."""
    route, request = leg.route, leg.request
    out = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **leg.headers()}
    )
    await out.prepare(request)
    first_at = last_at = time.perf_counter()
    judge_ttft(m, slo, route, first_at - leg.started, leg.prompt_tokens)
    events = first.count(b"data: ")
    try:
        await out.write(first)
        async for chunk in chunks:
            if request.transport is None or request.transport.is_closing():
                raise ConnectionResetError("client went away")  # closes the decode leg below
            await out.write(chunk)
            events += chunk.count(b"data: ")
            last_at = time.perf_counter()
    except aiohttp.ClientError as exc:
        call.report("error", route)
        err = {
            "error": {
                "message": f"decode stream from {leg.instance} broke: {exc.__class__.__name__}",
                "type": "upstream_error",
                "code": 502,
            }
        }
        await out.write(f"data: {json.dumps(err)}\n\n".encode())
        await out.write_eof()
        return out
    leg.drained = True
    # every event, [DONE] last, is on its way: the answer is complete, whatever happens to the stream's end marker
    # (a client such as the OpenAI SDK closes as soon as it reads [DONE], and write_eof then meets a closing
    # transport: before, such a stream counted as cancelled and its TPOT was never observed)
    if events > 2:  # the last event is [DONE]
        m.tpot.labels(route).observe((last_at - first_at) / (events - 2))
    m.e2e_by(route).observe(time.perf_counter() - leg.started)
    call.report("ok", route)
    with contextlib.suppress(ConnectionResetError):
        await out.write_eof()
    return out
