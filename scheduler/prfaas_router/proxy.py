"""The client-facing request path (router mode): parse once, decide, prefill (remote or local), decode, stream.

Failure semantics: a remote prefill that fails *before* decode starts (5xx, timeout, refused, a response
without a KV handle) falls back to local prefill and the client sees a normal answer; a decode that dies
mid-stream ends the client's stream with an error event promptly; beyond ``maxInFlight`` the router answers
429 with Retry-After; a client that disconnects cancels both legs (their connections close, so the engines
drop the work and free the KV).
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import orjson
import structlog
from aiohttp import web

from prfaas_core.api import RemoteGateway
from prfaas_core.names import REASON_WAIT_FOR_LINK
from prfaas_core.tokens import block_hashes

from . import link_wait
from .http_util import JSON_CONTENT, is_chat, json_bytes, json_error, new_session, read_token
from .legs import LINK_HEADER, LegError, decode_body, kv_handle, prefill_body, reported_prompt_tokens
from .metrics import RouterMetrics, judge_ttft
from .runtime import LocalPlan, Runtime
from .tokenizer import count_prompt

log = structlog.get_logger("prfaas.router")

ROUTE_HEADER = "x-prfaas-route"
"""Response header naming the route a request took: local, remote or fallback."""
PROMPT_TOKENS_HEADER = "x-prfaas-prompt-tokens"
"""Response header: the prompt's tokens as the router counted them (the model's tokenizer, or the estimate)."""


class Proxy:
    """Handlers of one router app; holds no global state."""

    def __init__(self, runtime: Runtime, http: httpx.AsyncClient, metrics: RouterMetrics) -> None:
        self.rt = runtime
        self.http = http
        """Off the hot path: remote status reads (signals)."""
        self.metrics = metrics
        self.session: aiohttp.ClientSession | None = None
        """The legs (prefill, decode); opened with the app (needs a running loop)."""
        self.remote_clients: dict[str, httpx.AsyncClient] = {}
        self.remote_tls: dict[str, ssl.SSLContext | bool] = {}
        self.remote_tokens: dict[str, str | None] = {}

    def open(self) -> None:
        if self.session is None:
            self.session = new_session()

    @property
    def legs(self) -> aiohttp.ClientSession:
        if self.session is None:
            raise RuntimeError("the proxy's HTTP session is not open")
        return self.session

    async def close(self) -> None:
        for client in self.remote_clients.values():
            await client.aclose()
        self.remote_clients.clear()

    async def shutdown(self) -> None:
        await self.close()
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def sync_remotes(self) -> None:
        """(Re)build the TLS clients and read the tokens of the configured remotes (after a reload too)."""
        await self.close()
        self.remote_tls.clear()
        for remote in self.rt.compiled.remotes:
            verify: Any = remote.ca_file if remote.ca_file else True
            self.remote_clients[remote.name] = httpx.AsyncClient(
                verify=verify, timeout=httpx.Timeout(remote.timeout_seconds, connect=5.0)
            )
            self.remote_tls[remote.name] = ssl.create_default_context(cafile=remote.ca_file) if remote.ca_file else True
            self.remote_tokens[remote.name] = read_token(remote.token_file)

    # --- entry point ----------------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        rt, m = self.rt, self.metrics
        limits = rt.compiled.config.limits
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return json_error(400, f"request body is not valid JSON: {exc}")
        if not isinstance(body, dict):
            return json_error(400, "request body must be a JSON object")
        try:
            ids = await count_prompt(body, is_chat(request.path), rt.compiled.tokenizer, len(raw))
        except ValueError as exc:
            return json_error(400, str(exc))
        if "stream" in body and not isinstance(body["stream"], bool):
            return json_error(400, "'stream' must be a boolean")
        if rt.in_flight >= limits.max_in_flight:
            m.requests.labels("none", "rejected").inc()
            return json_error(
                429,
                "router at its in-flight limit; retry later",
                "rate_limit_error",
                **{"Retry-After": str(limits.retry_after_seconds)},
            )
        rt.in_flight += 1
        m.in_flight.set(rt.in_flight)
        request_id = request.headers.get("x-request-id") or f"prfaas-{os.urandom(16).hex()}"
        try:
            return await self._serve(request, body, ids, request_id, started)
        finally:
            rt.in_flight -= 1
            m.in_flight.set(rt.in_flight)

    async def _serve(
        self, request: web.Request, body: dict[str, Any], ids: list[int], request_id: str, started: float
    ) -> web.StreamResponse:
        rt, m = self.rt, self.metrics
        c = rt.compiled
        hashes = block_hashes(ids, c.config.routing.prefix_block_tokens)
        pd_hits = rt.pd_index.match(hashes)
        t0 = time.perf_counter()
        routed = rt.route(len(ids), hashes, pd_hits)
        m.decision_seconds.observe(time.perf_counter() - t0)
        decision, remote = routed.decision, rt.remote_gateway(routed)
        rt.remember_length(decision.uncached_tokens, rt.model_now())
        route: str = decision.target
        m.decisions.labels(route, decision.kind).inc()
        kv: dict[str, Any] | None = None
        plan = rt.local_plan(routed)
        if plan is None:
            m.requests.labels(route, "unavailable").inc()
            return json_error(503, "no healthy decode instance", "service_unavailable")
        if remote is not None:
            try:
                kv, route = await self._remote_in_window(remote, request.path, body, request_id, decision, len(ids))
                if kv is not None:
                    rt.remote_index.insert(hashes, remote.name)
            except LegError as exc:
                route = "fallback"
                m.fallbacks.labels(_failure_kind(str(exc))).inc()
                log.warning(
                    "remote prefill failed; prefilling locally",
                    request_id=request_id,
                    remote=remote.name,
                    error=str(exc),
                )
        remote_kv = kv is not None
        if kv is None and plan.prefill is not None:
            try:
                kv = await self._local_prefill(plan, request.path, body, request_id, decision.uncached_tokens)
            except LegError as exc:
                m.requests.labels(route, "error").inc()
                return json_error(exc.status, f"prefill failed: {exc}", "upstream_error")
            rt.pd_index.insert(hashes, plan.prefill)
        prefilled = time.perf_counter() if kv is not None else None
        try:
            response = await self._decode(
                request, plan, body, kv, request_id, route, started, remote_kv, prefilled, prompt_tokens=len(ids)
            )
        except LegError as exc:
            if remote is not None and remote_kv:
                rt.remote_failed(remote.name, str(exc))
            if not (remote_kv and exc.retriable):
                m.requests.labels(route, "error").inc()
                return json_error(exc.status, str(exc), "upstream_error")
            # the remote KV could not be used (link cut, handle expired): prefill locally, decode again
            route = "fallback"
            m.fallbacks.labels("decode-kv-pull").inc()
            log.warning("decode could not use the remote KV; prefilling locally", request_id=request_id, error=str(exc))
            try:
                kv = await self._local_prefill(plan, request.path, body, request_id, len(ids)) if plan.prefill else None
                prefilled = time.perf_counter() if kv is not None else None
                response = await self._decode(
                    request, plan, body, kv, request_id, route, started, False, prefilled, prompt_tokens=len(ids)
                )
            except LegError as again:
                m.requests.labels(route, "error").inc()
                return json_error(again.status, str(again), "upstream_error")
        rt.pd_index.insert(hashes, plan.decode)
        return response

    # --- legs -------------------------------------------------------------------------------------------
    async def _remote_in_window(
        self, remote: RemoteGateway, path: str, body: dict[str, Any], request_id: str, decision: Any, total: int
    ) -> tuple[dict[str, Any] | None, str]:
        """The remote prefill under the gateway's admission (:mod:`.link_wait`): accept a window up to the
        local alternative's predicted TTFT; on a decline wait (re-submit) or go local, by predicted TTFT."""
        rt, m, c = self.rt, self.metrics, self.rt.compiled
        nbytes, uncached = decision.transfer_bytes, decision.uncached_tokens
        local = link_wait.local_ttft_s(rt.local_wait_s(), c.pd.prefill_seconds(float(total)))
        cap = c.links[remote.link].cap_gbps
        first = link_wait.max_wait_s(local, c.prfaas.prefill_seconds(float(uncached)), nbytes, cap)
        try:
            return await self._remote_prefill(remote, path, body, request_id, nbytes, uncached, first), "remote"
        except link_wait.LinkDeclined as declined:
            wait = link_wait.resubmit_wait_s(declined.decline, local)
            m.link_waits.labels(remote.link, "local" if wait is None else "waited").inc()
            if wait is None:
                m.decisions.labels("local", REASON_WAIT_FOR_LINK).inc()
                return None, "local"
            m.decisions.labels("remote", REASON_WAIT_FOR_LINK).inc()
            return await self._remote_prefill(remote, path, body, request_id, nbytes, uncached, wait), "remote"

    async def _remote_prefill(
        self,
        remote: RemoteGateway,
        path: str,
        body: dict[str, Any],
        request_id: str,
        nbytes: float,
        uncached: int,
        max_wait_s: float = float("inf"),
    ) -> dict[str, Any]:
        rt = self.rt
        duration = rt.compiled.prfaas.prefill_seconds(float(uncached))
        rt.start_transfer(remote.link, request_id, nbytes, duration)
        headers = {"x-request-id": request_id, LINK_HEADER: remote.link}
        if max_wait_s < float("inf"):
            headers.update(link_wait.admission_headers(remote.link, nbytes, max_wait_s))
        token = self.remote_tokens.get(remote.name)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        headers["Content-Type"] = JSON_CONTENT
        timeout = aiohttp.ClientTimeout(total=remote.timeout_seconds, sock_connect=5.0)
        now = rt.clock()
        try:
            async with self.legs.post(
                f"{remote.url}{path}",
                data=json_bytes(prefill_body(body)),
                headers=headers,
                timeout=timeout,
                ssl=self.remote_tls.get(remote.name, True),
            ) as resp:
                if resp.status == 429 and (decline := link_wait.parse_decline(429, await resp.read())):
                    rt.finish_transfer(request_id)
                    raise link_wait.LinkDeclined(decline)
                if resp.status != 200:
                    raise LegError(f"remote prefill answered {resp.status}")
                answer = orjson.loads(await resp.read())
                handle = kv_handle(answer)
        except link_wait.LinkDeclined:
            raise
        except (aiohttp.ClientError, TimeoutError, ValueError, LegError) as exc:
            rt.finish_transfer(request_id)
            why = exc if isinstance(exc, LegError) else LegError(f"remote prefill {exc.__class__.__name__}: {exc}")
            rt.remote_failed(remote.name, str(why), now)
            raise why from None
        rt.remote_succeeded(remote.name)
        # the KV now waits in region A for this region's decode to pull it: S_kv of what the engine prefilled
        tokens = reported_prompt_tokens(answer, uncached)
        self.metrics.remote_bytes.labels(remote.link).inc(rt.compiled.kv.kv_bytes(tokens))
        return handle

    async def _local_prefill(
        self, plan: LocalPlan, path: str, body: dict[str, Any], request_id: str, uncached: int
    ) -> dict[str, Any]:
        rt = self.rt
        assert plan.prefill is not None
        endpoint = rt.compiled.by_name[plan.prefill]
        seconds = rt.compiled.pd.prefill_seconds(float(uncached))
        timeouts = rt.compiled.config.timeouts
        with rt.prefill_queued(plan.prefill, seconds):
            try:
                async with self.legs.post(
                    f"{endpoint.url}{path}",
                    data=json_bytes(prefill_body(body)),
                    headers={"x-request-id": request_id, "Content-Type": JSON_CONTENT},
                    timeout=aiohttp.ClientTimeout(
                        total=timeouts.prefill_seconds, sock_connect=timeouts.connect_seconds
                    ),
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

    async def _decode(
        self,
        request: web.Request,
        plan: LocalPlan,
        body: dict[str, Any],
        kv: dict[str, Any] | None,
        request_id: str,
        route: str,
        started: float,
        kv_crosses_link: bool = False,
        prefilled: float | None = None,
        prompt_tokens: int = 0,
    ) -> web.StreamResponse:
        """The decode leg, streamed or not; ``prefilled`` is when the prefill leg returned the first token."""
        rt = self.rt
        leg = DecodeLeg(request, plan.decode, body, route, started, prompt_tokens)
        try:
            with rt.decoding(plan.decode):
                # the decode has *started* once its first byte arrives: until then a failure may be retried
                # elsewhere; when the KV crosses the link, a stalled pull is cut after kvPullSeconds
                limit = rt.compiled.config.timeouts.kv_pull_seconds if kv_crosses_link else None
                chunks, first = await self._open_decode(leg, kv, request_id, limit)
                rt.finish_transfer(request_id)
                if not body.get("stream"):
                    return await self._answer_whole(leg, chunks, first, prefilled)
                return await self._answer_stream(leg, chunks, first)
        except (asyncio.CancelledError, ConnectionResetError):
            self.metrics.requests.labels(route, "cancelled").inc()
            raise
        finally:
            rt.finish_transfer(request_id)
            leg.close()

    async def _open_decode(
        self, leg: DecodeLeg, kv: dict[str, Any] | None, request_id: str, limit: float | None
    ) -> tuple[AsyncIterator[bytes], bytes]:
        """Post the decode leg and wait for its first bytes (a failure before them may be retried)."""
        timeouts = self.rt.compiled.config.timeouts
        endpoint = self.rt.compiled.by_name[leg.instance]
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=timeouts.connect_seconds, sock_read=timeouts.decode_idle_seconds
        )

        async def open_leg() -> aiohttp.ClientResponse:
            return await self.legs.post(
                f"{endpoint.url}{leg.request.path}",
                data=json_bytes(decode_body(leg.body, kv)),
                headers={"x-request-id": request_id, "Content-Type": JSON_CONTENT},
                timeout=timeout,
            )

        try:
            upstream = leg.upstream = await asyncio.wait_for(open_leg(), limit)
            if upstream.status != 200:
                data = await upstream.read()
                leg.drained = True
                status = upstream.status
                raise LegError(
                    f"decode on {leg.instance} answered {status}: {data[:300].decode(errors='replace')}",
                    status=502 if status >= 500 else status,
                    retriable=status >= 500 or status in (404, 410),
                )
            chunks = upstream.content.iter_any()
            first = await asyncio.wait_for(anext(chunks, b""), limit)
        # aiohttp's read timeout is a ClientError *and* a TimeoutError: a failed leg, not a stalled pull
        except aiohttp.ClientError as exc:
            raise LegError(f"decode on {leg.instance} failed: {exc.__class__.__name__}") from None
        except TimeoutError:
            raise LegError(
                f"decode on {leg.instance} did not start within {limit:g} s: the KV pull across the link stalled"
            ) from None
        return chunks, first

    async def _answer_whole(
        self, leg: DecodeLeg, chunks: AsyncIterator[bytes], first: bytes, prefilled: float | None
    ) -> web.Response:
        """A non-streamed answer: the decode's body read to its end."""
        m, route = self.metrics, leg.route
        try:
            data = first + b"".join([c async for c in chunks])
        except aiohttp.ClientError as exc:
            raise LegError(
                f"decode on {leg.instance} broke mid-answer: {exc.__class__.__name__}", retriable=False
            ) from None
        leg.drained = True
        if prefilled is not None:
            judge_ttft(m, self.rt.compiled.config.slo, route, prefilled - leg.started, leg.prompt_tokens)
        m.e2e.labels(route).observe(time.perf_counter() - leg.started)
        m.requests.labels(route, "ok").inc()
        return web.Response(body=data, status=200, content_type="application/json", headers=leg.headers())

    async def _answer_stream(self, leg: DecodeLeg, chunks: AsyncIterator[bytes], first: bytes) -> web.StreamResponse:
        """A streamed answer: the decode's events passed on as they come; a break ends with an error event."""
        m, route, request = self.metrics, leg.route, leg.request
        out = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **leg.headers()}
        )
        await out.prepare(request)
        first_at = last_at = time.perf_counter()
        judge_ttft(m, self.rt.compiled.config.slo, route, first_at - leg.started, leg.prompt_tokens)
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
            m.requests.labels(route, "error").inc()
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
        await out.write_eof()
        if events > 2:  # the last event is [DONE]
            m.tpot.labels(route).observe((last_at - first_at) / (events - 2))
        m.e2e.labels(route).observe(time.perf_counter() - leg.started)
        m.requests.labels(route, "ok").inc()
        return out


@dataclass
class DecodeLeg:
    """One decode leg's context: whom it answers, where it runs, and its upstream response once open."""

    request: web.Request
    instance: str
    body: dict[str, Any]
    route: str
    started: float
    prompt_tokens: int
    upstream: aiohttp.ClientResponse | None = None
    drained: bool = False
    """The upstream was read to its end (it goes back to the pool; any other is closed)."""

    def headers(self) -> dict[str, str]:
        return {ROUTE_HEADER: self.route, PROMPT_TOKENS_HEADER: str(self.prompt_tokens)}

    def close(self) -> None:
        """Release a drained upstream to the pool; close any other, so that the engine sees the disconnect,
        drops the request and frees its KV."""
        if self.upstream is not None:
            if self.drained:
                self.upstream.release()
            else:
                self.upstream.close()


def _failure_kind(message: str) -> str:
    """A low-cardinality label for why a remote prefill failed."""
    for key, kind in (
        ("Timeout", "timeout"),
        ("answered 5", "remote-5xx"),
        ("answered 4", "remote-4xx"),
        ("Connect", "connect"),
        ("kv_transfer_params", "no-kv-handle"),
    ):
        if key in message:
            return kind
    return "other"
