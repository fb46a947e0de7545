"""The prefill legs of the request path: the remote prefill (under the gateway's admission, its outcome always
reported to the breaker), the local one, the router's side of the gateway's admission answer (the wait for a link
window) and the one retry of a failed local prefill. The proxy runs them (:mod:`.proxy`) with the request's
:class:`~.call.Call`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import structlog
from pydantic import ValidationError

from prfaas_core import names
from prfaas_core.api import AdmissionDecline, RemoteGateway
from prfaas_core.policy import link_calendar
from prfaas_core.policy.kv_index import unhonoured_tokens
from prfaas_core.policy.link_calendar import prefer_local
from prfaas_core.policy.link_estimate import Available
from prfaas_core.policy.link_view import link_view_headers
from prfaas_core.policy.routing import RouteDecision
from prfaas_core.request.slo import ttft_objective_s

from ..state.security import gateway_body
from ..state.wire import (
    JSON_CONTENT,
    LINK_HEADER,
    LegError,
    SideLost,
    json_bytes,
    kv_handle,
    prefill_body,
    remote_side,
    reported_prompt_tokens,
)
from .call import Call, LegHost, LocalPlan, abandon, local_plan, remote_auth

# --- The router's side of the gateway's admission answer: the headers a remote prefill carries, the 429 decline
# it may get back, and the choice it then makes — wait for the link window (re-submit, accepting the wait) or
# prefill locally — by predicted TTFT (:func:`prfaas_core.policy.link_calendar.choose_window`, the rule the
# simulator runs). Short requests reach the gateway only as spills (a PD queue surge), which wait only while the
# remote still beats local.
# The local ledger stays the router's fast pre-filter and its fallback when the gateway cannot be reached.

WAIT_SLACK = 1.25
"""A re-submission accepts this much more than the earliest start the gateway named (other routers book too)."""


class LinkDeclined(LegError):
    """The gateway declined with an :class:`AdmissionDecline` (not a failure: the breaker is not told)."""

    def __init__(self, decline: AdmissionDecline) -> None:
        super().__init__(f"gateway declined: {decline.reason} ({decline.message})", status=429, retriable=True)
        self.decline = decline


def admission_headers(
    link: str,
    kv_bytes: float,
    max_wait_s: float,
    available: Available | None = None,
    max_ttft_s: float = float("inf"),
    slo_ttft_s: float | None = None,
) -> dict[str, str]:
    """The admission headers; the TTFT bound and the SLO go along when known, the available bandwidth only while
    it bounds the configured capacity."""
    headers = {
        names.HEADER_KV_BYTES: str(int(kv_bytes)),
        names.HEADER_MAX_WAIT_MS: f"{max(0.0, max_wait_s) * 1000.0:.0f}",
        names.HEADER_LINK: link,
    }
    if max_ttft_s < float("inf"):
        headers[names.HEADER_MAX_TTFT_MS] = f"{max(0.0, max_ttft_s) * 1000.0:.0f}"
    if slo_ttft_s is not None:
        headers[names.HEADER_SLO_TTFT_MS] = f"{max(0.0, slo_ttft_s) * 1000.0:.0f}"
    if available is not None and available.gbps is not None:
        headers[names.HEADER_LINK_AVAILABLE_GBPS] = f"{available.gbps:.6g}"
    return headers


def parse_decline(status: int, body: bytes) -> AdmissionDecline | None:
    """The decline in a gateway's 429, or None (another status, or a 429 that is not the admission answer)."""
    if status != 429:
        return None
    try:
        data: Any = orjson.loads(body)
        return AdmissionDecline.model_validate(data)
    except (orjson.JSONDecodeError, ValidationError):
        return None


def local_ttft_s(local_wait_s: float | None, local_prefill_s: float) -> float:
    return (local_wait_s or 0.0) + local_prefill_s


def resubmit_wait_s(
    decline: AdmissionDecline,
    local_ttft: float,
    slo_ttft_s: float | None = None,
    local_wait_s: float = 0.0,
    spill: bool = False,
) -> float | None:
    """After a ``link_window`` decline: the wait to accept on re-submission, or None (go local), by the core's
    rule (:func:`prefer_local`) on the gateway's predicted TTFT (its calendar: every router's streams, the real
    PrFaaS queue). With an SLO, the request goes local only when the remote misses it while local fits it and a
    PD prefill instance is idle; without one (or for a spill), when local's predicted TTFT is better."""
    if decline.reason != "link_window" or decline.earliest_start_ms is None or decline.predicted_ttft_ms is None:
        return None
    if prefer_local(decline.predicted_ttft_ms / 1000.0, local_ttft, slo_ttft_s, local_wait_s, spill):
        return None
    return decline.earliest_start_ms / 1000.0 * WAIT_SLACK + 0.001


# --- One retry of a failed local prefill leg, before decode (never after: decode has not started).

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


async def prefill_with_retry(proxy: LegHost, call: Call, plan: LocalPlan, route: str, uncached: int) -> Prefilled:
    """The local prefill leg, and once more elsewhere if it failed retriably; LegError when both failed."""
    try:
        return Prefilled(await local_prefill(proxy, call, plan, uncached), plan, route, None)
    except LegError as exc:
        if exc.status < 500 or plan.prefill is None:
            raise
        first = exc
    rt, m = proxy.rt, proxy.metrics
    failed = plan.prefill
    routed = rt.route(call.prompt_tokens, call.hashes, call.pd_hits, exclude=frozenset({failed}))
    remote = rt.remote_gateway(routed)
    again = local_plan(rt, routed)
    if again is None or (remote is None and again.prefill is None):
        m.prefill_retries.labels("none", "unavailable").inc()
        log.warning(
            "prefill failed; no other instance to retry on",
            request_id=call.ids.trace,
            instance=failed,
            error=str(first),
        )
        raise first
    target = "remote" if remote is not None else "local"
    log.warning(
        "prefill failed; retrying once",
        request_id=call.ids.trace,
        instance=failed,
        error=str(first),
        retry_on=remote.name if remote is not None else again.prefill,
    )
    try:
        if remote is not None:
            d = routed.decision
            call.probe = routed.probe  # the retry's own probe ticket, if the breaker gave one
            kv = await remote_prefill(proxy, call, remote, d.transfer_bytes, d.uncached_tokens)
        else:
            kv = await local_prefill(proxy, call, again, routed.decision.uncached_tokens)
    except (LegError, LinkDeclined) as exc:
        m.prefill_retries.labels(target, "error").inc()
        status = exc.status if isinstance(exc, LegError) else 503
        failure = LegError(f"{first}; retry on {target} failed too: {exc}", status=status)
        if remote is not None or again.prefill is None or status < 500:
            raise failure from None
        # both local instances failed: every local one may be down (a bad rollout, a shared dependency); the
        # remote, if it is available, takes the request rather than the client getting a 502
        return await remote_last(proxy, call, failure)
    m.prefill_retries.labels(target, "ok").inc()
    return Prefilled(kv, again, RETRY_ROUTE, remote)


async def remote_last(proxy: LegHost, call: Call, failure: LegError) -> Prefilled:
    """The local prefill failed on two instances: the remote prefills it if one is available (routed with every
    local prefill instance left out, the core's no-local-prefill rule); ``failure`` raised when none is."""
    rt, m = proxy.rt, proxy.metrics
    every = frozenset(e.name for e in rt.compiled.prefill)
    routed = rt.route(call.prompt_tokens, call.hashes, call.pd_hits, exclude=every)
    remote = rt.remote_gateway(routed)
    plan = local_plan(rt, routed)
    if remote is None or plan is None:
        if remote is not None:
            rt.remote_cancelled(remote.name, routed.probe)
        m.prefill_retries.labels("none", "unavailable").inc()
        log.warning("prefill failed on every local instance tried; no remote available", request_id=call.ids.trace)
        raise failure
    log.warning(
        "prefill failed on every local instance tried; the remote takes it",
        request_id=call.ids.trace,
        remote=remote.name,
        error=str(failure),
    )
    call.probe = routed.probe
    d = routed.decision
    try:
        kv = await remote_prefill(proxy, call, remote, d.transfer_bytes, d.uncached_tokens)
    except (LegError, LinkDeclined) as exc:
        m.prefill_retries.labels("remote", "error").inc()
        raise LegError(f"{failure}; then the remote failed too: {exc}", status=failure.status) from None
    m.prefill_retries.labels("remote", "ok").inc()
    return Prefilled(kv, plan, RETRY_ROUTE, remote)


# --- The prefill legs: the remote prefill (under the gateway's admission) and the local one


async def remote_prefill(
    proxy: LegHost,
    call: Call,
    remote: RemoteGateway,
    nbytes: float,
    uncached: int,
    max_wait_s: float = float("inf"),
    max_ttft_s: float = float("inf"),
    slo_ttft_s: float | None = None,
) -> dict[str, Any]:
    """The remote prefill leg; its outcome always reaches the breaker (success, failure, cancellation), under the
    call's probe ticket; the gateway's timing and pull id are the call's."""
    rt, request_id, probe = proxy.rt, call.ids, call.probe
    duration = rt.compiled.prfaas.prefill_seconds(float(uncached))
    rt.start_transfer(remote.link, request_id.key, nbytes, duration)
    headers = {**request_id.headers(), LINK_HEADER: remote.link}
    if max_wait_s < float("inf"):
        avail = rt.available.get(remote.link)
        headers.update(admission_headers(remote.link, nbytes, max_wait_s, avail, max_ttft_s, slo_ttft_s))
        view = rt.compiled.links.get(remote.link)
        if view is not None:  # the gateway refuses a view of the link that disagrees with its own (400)
            headers.update(link_view_headers(view.capacity_gbps, view.max_utilization))
    headers.update(remote_auth(proxy, remote.name))
    headers["Content-Type"] = JSON_CONTENT
    if call.decode_cached > 0:  # the gateway books only what the decode will pull
        headers[names.HEADER_DECODE_CACHED_TOKENS] = str(call.decode_cached)
    timeout = aiohttp.ClientTimeout(total=remote.timeout_seconds, sock_connect=5.0)
    now = rt.clock()

    async def leg() -> tuple[dict[str, Any], Any]:
        async with proxy.legs.post(
            f"{remote.url}{call.path}",
            data=json_bytes(gateway_body(prefill_body(call.body))),
            headers=headers,
            timeout=timeout,
            ssl=proxy.remote_tls.get(remote.name, True),
        ) as resp:
            if resp.status == 429 and (decline := parse_decline(429, await resp.read())):
                rt.finish_transfer(request_id.key)
                raise LinkDeclined(decline)
            if resp.status != 200:
                raise LegError(f"remote prefill answered {resp.status}")
            answer = orjson.loads(await resp.read())
            call.gateway_timing = resp.headers.get(names.SERVER_TIMING, "")
            pull_id = resp.headers.get(names.HEADER_PULL_ID)
            if pull_id:  # the gateway counts the pull on the wire until this router reports it over
                call.pull = (remote.name, pull_id)
            return kv_handle(answer), answer

    try:
        handle, answer = await proxy.aborts.run(remote_side(remote.name), leg())
    except LinkDeclined as declined:  # no verdict on the remote: a probe's slot is freed
        rt.remote_cancelled(remote.name, probe)
        given_up = declined.decline.kv_handle  # kv_lease: a prefill the gateway ran, then gave up on
        if given_up is not None and call.plan is not None:
            abandon(proxy, given_up, "prfaas", call.plan.decode, request_id, str(declined))
        raise
    except (aiohttp.ClientError, TimeoutError, ValueError, LegError, SideLost) as exc:
        rt.finish_transfer(request_id.key)
        if isinstance(exc, SideLost):
            why = LegError(f"remote prefill cut short: {remote.name} turned unready ({exc})")
        else:
            why = exc if isinstance(exc, LegError) else LegError(f"remote prefill {exc.__class__.__name__}: {exc}")
        rt.remote_failed(remote.name, str(why), now)
        raise why from None
    except BaseException:  # cancelled (the client went away): no verdict, but a probe's slot is freed
        rt.finish_transfer(request_id.key)
        rt.remote_cancelled(remote.name, probe)
        raise
    rt.remote_succeeded(remote.name)
    # the KV now waits in region A for this region's decode to pull it: S_kv of what the engine prefilled
    tokens = reported_prompt_tokens(answer, uncached)
    proxy.metrics.remote_bytes.labels(remote.link).inc(rt.compiled.kv.pulled_kv_bytes(tokens, call.decode_cached))
    return handle


async def local_prefill(proxy: LegHost, call: Call, plan: LocalPlan, uncached: int) -> dict[str, Any]:
    rt = proxy.rt
    assert plan.prefill is not None
    endpoint = rt.compiled.by_name[plan.prefill]
    seconds = rt.compiled.pd.prefill_seconds(float(uncached))
    timeouts = rt.compiled.config.timeouts
    with rt.prefill_queued(plan.prefill, seconds):
        try:
            async with proxy.legs.post(
                f"{endpoint.url}{call.path}",
                data=json_bytes(prefill_body(call.body)),
                headers={**call.ids.headers(), "Content-Type": JSON_CONTENT},
                timeout=aiohttp.ClientTimeout(total=timeouts.prefill_seconds, sock_connect=timeouts.connect_seconds),
            ) as resp:
                data = await resp.read()
                if resp.status != 200:
                    text = data[:200].decode(errors="replace")
                    raise LegError(
                        f"local prefill on {plan.prefill} answered {resp.status}: {text}",
                        status=502 if resp.status >= 500 else resp.status,
                    )
                answer = orjson.loads(data)
                block = rt.compiled.config.routing.prefix_block_tokens
                short = unhonoured_tokens(call.pd_hits.get(plan.prefill, 0), call.prompt_tokens, block, answer)
                if short:  # the engine's cached_tokens is the truth; the index over-promised on this instance
                    proxy.metrics.prefix_unhonoured.labels("pd").inc(short)
                return kv_handle(answer)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise LegError(f"local prefill on {plan.prefill}: {exc.__class__.__name__}") from None
        except ValueError:
            raise LegError(f"local prefill on {plan.prefill} answered a body that is not JSON") from None


async def remote_in_window(
    proxy: LegHost, call: Call, remote: RemoteGateway, decision: RouteDecision
) -> tuple[dict[str, Any] | None, str]:
    """The remote prefill under the gateway's admission: the first try accepts a window up to where the remote
    TTFT, as the gateway's calendar predicts it, reaches the local alternative's (or the request's SLO, when that
    is later); on a decline, wait (re-submit) or go local by :func:`resubmit_wait_s`. A spill (a
    request ``t`` kept local, sent remote for a PD queue surge) waits only while its remote TTFT beats local's
    (the core's rule, as in the simulator). Returns (the KV handle or None, the route)."""
    rt, m, c = proxy.rt, proxy.metrics, proxy.rt.compiled
    nbytes, uncached, total = decision.transfer_bytes, decision.uncached_tokens, call.prompt_tokens
    queue = rt.local_wait_s()
    local = local_ttft_s(queue, c.pd.prefill_seconds(float(total)))
    slo = ttft_objective_s(c.config.slo, total) if c.config.slo is not None else None
    cap = rt.link_params(remote.link).cap_gbps
    spill = decision.kind == "spill"
    limit = link_calendar.accepted_ttft_s(local, slo, spill)
    first = link_calendar.max_wait_s(limit, c.prfaas.prefill_seconds(float(uncached)), nbytes, cap)
    try:
        kv = await remote_prefill(proxy, call, remote, nbytes, uncached, first, limit, slo)
        return kv, "remote"
    except LinkDeclined as declined:
        wait = resubmit_wait_s(declined.decline, local, slo, queue or 0.0, spill)
        m.link_waits.labels(remote.link, "local" if wait is None else "waited").inc()
        if wait is None:
            m.decisions.labels("local", names.REASON_WAIT_FOR_LINK).inc()
            return None, "local"
        m.decisions.labels("remote", names.REASON_WAIT_FOR_LINK).inc()
        m.link_wait_seconds.labels(remote.link).observe(wait / WAIT_SLACK)
        kv = await remote_prefill(proxy, call, remote, nbytes, uncached, wait, slo_ttft_s=slo)
        return kv, "remote"
