"""The prefill legs of the request path: the remote prefill (under the gateway's admission, its outcome always
reported to the breaker) and the local one. The proxy runs them (:mod:`.proxy`), and so do the wait for a link
window (:mod:`.link_wait`) and the one retry (:mod:`.retry`)."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from prfaas_core import names
from prfaas_core.api import RemoteGateway
from prfaas_core.policy.routing import RouteDecision
from prfaas_core.request.slo import ttft_objective_s

from . import link_wait
from .aborts import SideLost, remote_side
from .http_util import JSON_CONTENT, json_bytes
from .leg_host import LegHost, remote_auth
from .legs import LINK_HEADER, LegError, kv_handle, prefill_body, reported_prompt_tokens
from .runtime import LocalPlan
from .security import RequestIds, gateway_body


async def remote_prefill(
    proxy: LegHost,
    remote: RemoteGateway,
    path: str,
    body: dict[str, Any],
    request_id: RequestIds,
    nbytes: float,
    uncached: int,
    max_wait_s: float = float("inf"),
    probe: float | None = None,
    max_ttft_s: float = float("inf"),
    slo_ttft_s: float | None = None,
    decode_cached: int = 0,
) -> dict[str, Any]:
    """The remote prefill leg; its outcome always reaches the breaker (success, failure, cancellation)."""
    rt = proxy.rt
    duration = rt.compiled.prfaas.prefill_seconds(float(uncached))
    rt.start_transfer(remote.link, request_id.key, nbytes, duration)
    headers = {"x-request-id": request_id.trace, LINK_HEADER: remote.link}
    if max_wait_s < float("inf"):
        avail = rt.available.get(remote.link)
        headers.update(link_wait.admission_headers(remote.link, nbytes, max_wait_s, avail, max_ttft_s, slo_ttft_s))
    headers.update(remote_auth(proxy, remote.name))
    headers["Content-Type"] = JSON_CONTENT
    if decode_cached > 0:  # the gateway books only what the decode will pull
        headers[names.HEADER_DECODE_CACHED_TOKENS] = str(decode_cached)
    timeout = aiohttp.ClientTimeout(total=remote.timeout_seconds, sock_connect=5.0)
    now = rt.clock()

    async def leg() -> tuple[dict[str, Any], Any]:
        async with proxy.legs.post(
            f"{remote.url}{path}",
            data=json_bytes(gateway_body(prefill_body(body))),
            headers=headers,
            timeout=timeout,
            ssl=proxy.remote_tls.get(remote.name, True),
        ) as resp:
            if resp.status == 429 and (decline := link_wait.parse_decline(429, await resp.read())):
                rt.finish_transfer(request_id.key)
                raise link_wait.LinkDeclined(decline)
            if resp.status != 200:
                raise LegError(f"remote prefill answered {resp.status}")
            answer = orjson.loads(await resp.read())
            rt.gateway_timing[request_id.key] = resp.headers.get(names.SERVER_TIMING, "")
            pull_id = resp.headers.get(names.HEADER_PULL_ID)
            if pull_id:  # the gateway counts the pull on the wire until this router reports it over
                rt.gateway_pulls[request_id.key] = (remote.name, pull_id)
            return kv_handle(answer), answer

    try:
        handle, answer = await proxy.aborts.run(remote_side(remote.name), leg())
    except link_wait.LinkDeclined:  # no verdict on the remote: a probe's slot is freed
        rt.remote_cancelled(remote.name, probe)
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
    proxy.metrics.remote_bytes.labels(remote.link).inc(rt.compiled.kv.pulled_kv_bytes(tokens, decode_cached))
    return handle


async def local_prefill(
    proxy: LegHost, plan: LocalPlan, path: str, body: dict[str, Any], request_id: RequestIds, uncached: int
) -> dict[str, Any]:
    rt = proxy.rt
    assert plan.prefill is not None
    endpoint = rt.compiled.by_name[plan.prefill]
    seconds = rt.compiled.pd.prefill_seconds(float(uncached))
    timeouts = rt.compiled.config.timeouts
    with rt.prefill_queued(plan.prefill, seconds):
        try:
            async with proxy.legs.post(
                f"{endpoint.url}{path}",
                data=json_bytes(prefill_body(body)),
                headers={"x-request-id": request_id.trace, "Content-Type": JSON_CONTENT},
                timeout=aiohttp.ClientTimeout(total=timeouts.prefill_seconds, sock_connect=timeouts.connect_seconds),
            ) as resp:
                data = await resp.read()
                if resp.status != 200:
                    text = data[:200].decode(errors="replace")
                    raise LegError(
                        f"local prefill on {plan.prefill} answered {resp.status}: {text}",
                        status=502 if resp.status >= 500 else resp.status,
                    )
                return kv_handle(orjson.loads(data))
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise LegError(f"local prefill on {plan.prefill}: {exc.__class__.__name__}") from None
        except ValueError:
            raise LegError(f"local prefill on {plan.prefill} answered a body that is not JSON") from None


async def remote_in_window(
    proxy: LegHost,
    remote: RemoteGateway,
    path: str,
    body: dict[str, Any],
    request_id: RequestIds,
    decision: RouteDecision,
    total: int,
    probe: float | None = None,
    decode_cached: int = 0,
) -> tuple[dict[str, Any] | None, str]:
    """The remote prefill under the gateway's admission: the first try accepts a window up to where the remote
    TTFT, as the gateway's calendar predicts it, reaches the local alternative's (or the request's SLO, when that
    is later); on a decline, wait (re-submit) or go local by :func:`.link_wait.resubmit_wait_s`. A spill (a
    request ``t`` kept local, sent remote for a PD queue surge) waits only while its remote TTFT beats local's
    (the core's rule, as in the simulator). Returns (the KV handle or None, the route)."""
    rt, m, c = proxy.rt, proxy.metrics, proxy.rt.compiled
    nbytes, uncached = decision.transfer_bytes, decision.uncached_tokens
    queue = rt.local_wait_s()
    local = link_wait.local_ttft_s(queue, c.pd.prefill_seconds(float(total)))
    slo = ttft_objective_s(c.config.slo, total) if c.config.slo is not None else None
    cap = rt.link_params(remote.link).cap_gbps
    spill = decision.kind == "spill"
    limit = link_wait.accepted_ttft_s(local, slo, spill)
    first = link_wait.max_wait_s(limit, c.prfaas.prefill_seconds(float(uncached)), nbytes, cap)
    try:
        kv = await remote_prefill(
            proxy, remote, path, body, request_id, nbytes, uncached, first, probe, limit, slo, decode_cached
        )
        return kv, "remote"
    except link_wait.LinkDeclined as declined:
        wait = link_wait.resubmit_wait_s(declined.decline, local, slo, queue or 0.0, spill)
        m.link_waits.labels(remote.link, "local" if wait is None else "waited").inc()
        if wait is None:
            m.decisions.labels("local", names.REASON_WAIT_FOR_LINK).inc()
            return None, "local"
        m.decisions.labels("remote", names.REASON_WAIT_FOR_LINK).inc()
        m.link_wait_seconds.labels(remote.link).observe(wait / link_wait.WAIT_SLACK)
        kv = await remote_prefill(
            proxy,
            remote,
            path,
            body,
            request_id,
            nbytes,
            uncached,
            wait,
            probe,
            slo_ttft_s=slo,
            decode_cached=decode_cached,
        )
        return kv, "remote"
