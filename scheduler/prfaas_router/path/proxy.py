"""The client-facing request path (router mode): parse once, decide, prefill (remote or local), decode, stream.

Failure semantics: a remote prefill that fails *before* decode starts (5xx, timeout, refused, a response
without a KV handle) falls back to local prefill and the client sees a normal answer; a decode that dies
mid-stream ends the client's stream with an error event promptly; beyond ``maxInFlight`` the router answers
429 with Retry-After; a client that disconnects cancels both legs (their connections close, so the engines
drop the work and free the KV).
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
import orjson
import structlog
from aiohttp import web

from prfaas_core.policy.kv_index import cache_kind
from prfaas_core.policy.routing import RouteDecision
from prfaas_core.policy.short_term import RoutePlan
from prfaas_core.request.params import check_request, tenant_salt
from prfaas_core.request.tokens import block_hashes
from prfaas_core.request.tracecontext import START_BYTES, trace_context

from ..state.config import count_prompt
from ..state.metrics import RouterMetrics
from ..state.runtime import Runtime
from ..state.security import RequestIds
from ..state.wire import (
    ENGINE,
    JSON_CONTENT,
    Aborts,
    ContextLength,
    LegError,
    LegSession,
    decode_body,
    is_chat,
    json_bytes,
    json_error,
    model_not_found,
    read_token,
    remote_side,
    within,
)
from .call import (
    PROMPT_TOKENS_HEADER,
    ROUTE_HEADER,
    Call,
    DecodeLeg,
    LocalPlan,
    answer_stream,
    answer_whole,
    failure_kind,
    give_up_kv,
    local_plan,
    over_limit,
    plan_local,
    report_pull_over,
    retry_after_s,
)
from .prefill import local_prefill, prefill_with_retry, remote_in_window

log = structlog.get_logger("prfaas.router")

__all__ = ["PROMPT_TOKENS_HEADER", "ROUTE_HEADER", "Proxy"]


class Proxy:
    """Handlers of one router app; holds no global state."""

    def __init__(self, runtime: Runtime, http: httpx.AsyncClient, metrics: RouterMetrics) -> None:
        self.rt = runtime
        self.http = http
        """Off the hot path: remote status reads (signals)."""
        self.metrics = metrics
        self.session: LegSession | None = None
        """The legs (prefill, decode); opened with the app (needs a running loop)."""
        self.remote_clients: dict[str, httpx.AsyncClient] = {}
        self.remote_tls: dict[str, ssl.SSLContext | bool] = {}
        self.remote_tokens: dict[str, str | None] = {}
        self.models: frozenset[str] | None = None
        """The model names requests may name (None: any)."""
        self.aborts = Aborts()
        """Remote legs in flight, cut short when their remote turns unready (the refresher calls abort)."""
        self.context = ContextLength()
        """The model's maximum context length as the PD engines name it (``/v1/models``); None: not known yet."""

    def open(self) -> None:
        if self.session is None:
            self.session = LegSession.open()

    @property
    def legs(self) -> LegSession:
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
        self.context.learn(self.http, self.rt.compiled.config.endpoints)  # the engines may change
        for remote in self.rt.compiled.remotes:
            # one context per remote (reading its CA once), for the httpx client and the aiohttp legs alike
            verify: ssl.SSLContext | bool = (
                ssl.create_default_context(cafile=remote.ca_file) if remote.ca_file else True
            )
            self.remote_clients[remote.name] = httpx.AsyncClient(
                verify=verify, timeout=httpx.Timeout(remote.timeout_seconds, connect=5.0)
            )
            self.remote_tls[remote.name] = verify
            self.remote_tokens[remote.name] = None
        self.refresh_tokens()

    def refresh_tokens(self) -> None:
        """Re-read the remotes' token files (rotated in place); an unreadable one keeps the last good token."""
        for remote in self.rt.compiled.remotes:
            try:
                token = read_token(remote.token_file)
            except OSError as exc:
                log.error(
                    "remote token file unreadable; keeping the last good token", remote=remote.name, error=str(exc)
                )
                continue
            if token == self.remote_tokens.get(remote.name) and remote.name in self.remote_tokens:
                continue
            self.remote_tokens[remote.name] = token
            client = self.remote_clients.get(remote.name)
            if client is not None and token:
                client.headers["Authorization"] = f"Bearer {token}"  # the status reads

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
            # the whole request, the decode leg's parameters too, before any leg costs engine work
            check_request(body, is_chat(request.path))
            if (tenant := rt.compiled.config.security.tenant_header) is not None:  # no cache oracle across tenants
                body["cache_salt"] = tenant_salt(request.headers.get(tenant), body.get("cache_salt"))
            ENGINE.check_body(body)
            ids = await count_prompt(body, is_chat(request.path), rt.compiled.tokenizer, len(raw))
            self.context.check(body, is_chat(request.path), len(ids), self.http, rt.compiled.config.endpoints)
        except ValueError as exc:
            return json_error(400, str(exc))
        if "stream" in body and not isinstance(body["stream"], bool):
            return json_error(400, "'stream' must be a boolean")
        if self.models is not None and body.get("model") not in self.models:
            return model_not_found(body.get("model"))
        # the ledger keys on an id the router makes; the client's x-request-id only travels for tracing
        # the client's trace context (or a new trace) on every leg: the engines' spans join the client's trace
        context = trace_context(request.headers, os.urandom(START_BYTES))
        request_ids = RequestIds(os.urandom(12).hex(), request.headers.get("x-request-id", "")[:200], context)
        call = Call(request_ids, m, request.path, body, len(ids), started, prompt_ids=ids)
        if rt.in_flight >= limits.max_in_flight:
            return call.refuse(
                "rejected",
                429,
                "router at its in-flight limit; retry later",
                "rate_limit_error",
                **{"Retry-After": str(limits.retry_after_seconds)},
            )
        rt.in_flight += 1
        m.in_flight.set(rt.in_flight)
        try:
            return await self._serve(request, call, ids)
        except BaseException as exc:  # the client went away (or a fault): counted once, as the call ends
            cancelled = isinstance(exc, (asyncio.CancelledError, ConnectionResetError))
            call.report("cancelled" if cancelled else "error")
            give_up_kv(self, call, "the call ended before its decode started")  # else it waits out its lease
            raise
        finally:
            report_pull_over(self, call)  # once per pull: a no-op when its decode reported it
            rt.in_flight -= 1
            m.in_flight.set(rt.in_flight)

    async def _serve(self, request: web.Request, call: Call, ids: list[int]) -> web.StreamResponse:
        """Route, prefill, decode; a step that ends the request answers the client itself (its outcome counted)."""
        routed = self._route(call, ids)
        refused = self._refusal(call, routed)
        if refused is not None:
            return refused
        failed = await self._prefill(call, routed.decision)
        if failed is not None:
            return failed
        return await self._decode_or_fall_back(request, call)

    def _route(self, call: Call, ids: list[int]) -> RoutePlan:
        """The routing decision (timed, its prefix hits and lengths counted): the call's route, remote, probe
        ticket and local plan."""
        rt, m = self.rt, self.metrics
        c = rt.compiled
        call.hashes = block_hashes(ids, c.config.routing.prefix_block_tokens, call.body.get("cache_salt"))
        call.pd_hits = rt.pd_index.match(call.hashes)
        t0 = time.perf_counter()
        routed, (l_pd, l_prfaas) = rt.route_prefixed(len(ids), call.hashes, call.pd_hits)
        m.decision_seconds.observe(time.perf_counter() - t0)
        kind = cache_kind(c.kv.recurrent)
        m.prefix_queries_by("pd").inc(len(ids))
        m.prefix_hits_by("pd", kind).inc(l_pd)
        if c.remotes:
            m.prefix_queries_by("prfaas").inc(len(ids))
            m.prefix_hits_by("prfaas", kind).inc(l_prfaas)
        decision = routed.decision
        call.remote, call.probe, call.route = rt.remote_gateway(routed), routed.probe, decision.target
        call.plan = local_plan(rt, routed)
        rt.remember_length(decision.uncached_tokens, rt.model_now())
        m.uncached_tokens.observe(decision.uncached_tokens)
        m.decisions_by(call.route, decision.kind).inc()
        return routed

    def _refusal(self, call: Call, routed: RoutePlan) -> web.Response | None:
        """503 when nothing can serve the request, 429 when its predicted TTFT exceeds the limit; None: serve it."""
        plan, remote = call.plan, call.remote
        if plan is None:
            why = routed.decode.reason if routed.decode is not None else "no decode instance"
            return call.refuse("unavailable", 503, f"cannot serve: {why}", "service_unavailable")
        if remote is None and plan.no_prefill is not None:
            why = f"{plan.no_prefill}; {routed.decision.reason}"
            return call.refuse("unavailable", 503, f"cannot serve: {why}", "service_unavailable")
        legs = self.aborts.in_flight(remote_side(remote.name)) if remote is not None else 0
        overloaded = over_limit(self.rt, routed, remote, legs)
        if overloaded is None:
            return None
        if remote is not None:
            self.rt.remote_cancelled(remote.name, call.probe)
        predicted, limit = overloaded
        return call.refuse(
            "rejected",
            429,
            f"predicted time to first token {predicted:.1f} s on the {call.route} side exceeds {limit:g} s; "
            "retry later",
            "rate_limit_error",
            **{"Retry-After": str(retry_after_s(predicted, limit))},
        )

    async def _prefill(self, call: Call, decision: RouteDecision) -> web.Response | None:
        """The prefill leg: remote in its link window (a failure falls back to local), else local with one retry.
        Sets the call's KV handle, plan and route; an answer when the request ends here."""
        rt, m = self.rt, self.metrics
        plan, remote = call.plan, call.remote
        assert plan is not None
        if remote is not None:
            try:
                block = rt.compiled.config.routing.prefix_block_tokens
                call.decode_cached = rt.decode_held.held_tokens(
                    call.prompt_ids, plan.decode, call.unsalted_hashes, block
                )
                call.kv, call.route = await remote_in_window(self, call, remote, decision)
                if call.kv is not None:
                    rt.remote_index.insert(call.hashes, remote.name)
            except LegError as exc:
                call.route = "fallback"
                m.fallbacks.labels(failure_kind(str(exc))).inc()
                log.warning(
                    "remote prefill failed; prefilling locally",
                    request_id=call.ids.trace,
                    remote=remote.name,
                    error=str(exc),
                )
                if plan.no_prefill is not None:
                    return call.refuse(
                        "unavailable", 503, f"cannot serve: {plan.no_prefill}; {exc}", "service_unavailable"
                    )
        if call.kv is None and plan.no_prefill is not None:  # the remote declined it and nothing local can prefill
            why = f"{plan.no_prefill}; the remote declined it"
            return call.refuse("unavailable", 503, f"cannot serve: {why}", "service_unavailable")
        call.remote_kv = call.kv is not None
        call.plan = plan = self._replan(plan, call.prompt_tokens, call.hashes)
        if call.kv is None and plan.prefill is not None:
            try:
                done = await prefill_with_retry(self, call, plan, call.route, decision.uncached_tokens)
            except LegError as exc:
                return call.refuse("error", exc.status, f"prefill failed: {exc}", "upstream_error")
            call.kv, call.plan, call.route, call.remote_kv = done.kv, done.plan, done.route, done.remote is not None
            call.remote = done.remote or remote
            if done.remote is not None:
                rt.remote_index.insert(call.hashes, done.remote.name)
            elif done.plan.prefill is not None:
                rt.pd_index.insert(call.hashes, done.plan.prefill)
        call.prefilled = time.perf_counter() if call.kv is not None else None
        return None

    async def _decode_or_fall_back(self, request: web.Request, call: Call) -> web.StreamResponse:
        """The decode leg; when it cannot use the remote KV (link cut, handle expired), prefill locally and decode
        again. The decode instance's prefix is indexed once it answered."""
        rt = self.rt
        assert call.plan is not None
        call.plan = self._replan(call.plan, call.prompt_tokens, call.hashes, keep_prefill=True)
        try:
            response = await self._decode(request, call, call.kv, call.remote_kv)
        except LegError as exc:
            if call.remote is not None and call.remote_kv:
                rt.remote_failed(call.remote.name, str(exc))
            give_up_kv(self, call, str(exc))  # no decode will pull it: released now, not at its lease
            if not (call.remote_kv and exc.retriable):
                return call.refuse("error", exc.status, str(exc), "upstream_error")
            # the remote KV could not be used (link cut, handle expired): prefill locally, decode again
            call.route = "fallback"
            self.metrics.fallbacks.labels("decode-kv-pull").inc()
            log.warning(
                "decode could not use the remote KV; prefilling locally", request_id=call.ids.trace, error=str(exc)
            )
            plan = self._replan(call.plan, call.prompt_tokens, call.hashes)
            try:
                call.kv = await local_prefill(self, call, plan, call.prompt_tokens) if plan.prefill else None
                call.remote_kv = call.kv_settled = False
                call.prefilled = time.perf_counter() if call.kv is not None else None
                call.plan = self._replan(plan, call.prompt_tokens, call.hashes, keep_prefill=True)
                response = await self._decode(request, call, call.kv)
            except LegError as again:
                give_up_kv(self, call, str(again))
                return call.refuse("error", again.status, str(again), "upstream_error")
        rt.pd_index.insert(call.hashes, call.plan.decode)
        if rt.compiled.remotes:  # what the decode holds counts only against a remote prefill's KV
            block = rt.compiled.config.routing.prefix_block_tokens
            rt.decode_held.learn(call.prompt_ids, call.plan.decode, call.unsalted_hashes, block)
        return response

    def _replan(self, plan: LocalPlan, tokens: int, hashes: list[bytes], keep_prefill: bool = False) -> LocalPlan:
        """A plan made before a long leg (a remote prefill) may name an instance that has since started
        draining or changed role (a flip in progress, or one the routers learnt of meanwhile): re-pick those
        from the configuration in force now, keep the others."""
        c = self.rt.compiled

        def stale(name: str | None, role: str) -> bool:
            ep = c.by_name.get(name) if name is not None else None
            return name is not None and (ep is None or name in c.draining or ep.role not in (role, "both"))

        # keep_prefill: the prefill leg has run (its KV is there), only the decode may move
        bad_prefill = not keep_prefill and stale(plan.prefill, "prefill")
        bad_decode = stale(plan.decode, "decode")
        if not (bad_prefill or bad_decode):
            return plan
        fresh = plan_local(self.rt, tokens, hashes)
        if fresh is None:
            return plan
        return LocalPlan(fresh.prefill if bad_prefill else plan.prefill, fresh.decode if bad_decode else plan.decode)

    async def _decode(
        self, request: web.Request, call: Call, kv: dict[str, Any] | None, kv_crosses_link: bool = False
    ) -> web.StreamResponse:
        """The decode leg on the call's plan, streamed or not (the call's ``prefilled``: when the prefill leg
        returned the KV handle)."""
        rt, plan = self.rt, call.plan
        assert plan is not None
        leg = DecodeLeg(request, plan.decode, call.body, call.route, call.started, call.prompt_tokens, call.prefilled)
        leg.gateway_timing = call.gateway_timing if kv_crosses_link else ""
        leg.timing = rt.compiled.config.security.server_timing
        try:
            with rt.decoding(plan.decode, call.key if kv_crosses_link else None):
                # the decode has *started* once its first byte arrives: until then a failure may be retried
                # elsewhere; when the KV crosses the link, a stalled pull is cut after kvPullSeconds
                limit = rt.compiled.config.timeouts.kv_pull_seconds if kv_crosses_link else None
                chunks, first = await self._open_decode(leg, kv, call.ids, limit)
                call.kv_settled = True  # the decode started with the KV: it pulls it or frees it
                self._transfer_over(call, pulled=kv_crosses_link)
                slo = rt.compiled.config.slo
                if not call.body.get("stream"):
                    return await answer_whole(self.metrics, call, leg, chunks, first, call.prefilled, slo)
                return await answer_stream(self.metrics, call, leg, chunks, first, slo)
        except (asyncio.CancelledError, ConnectionResetError):
            call.report("cancelled")
            raise
        finally:
            self._transfer_over(call)
            leg.close()

    def _transfer_over(self, call: Call, pulled: bool = False) -> None:
        """The request's KV stream is over (its decode's first byte, or the decode ended): the router's ledger
        and link estimator learn it (:meth:`Runtime.finish_transfer`), and the gateway that let its pull onto
        the wire is told (:func:`.call.report_pull_over`). Both are once per stream."""
        self.rt.finish_transfer(call.key, pulled=pulled)
        report_pull_over(self, call)

    async def _open_decode(
        self, leg: DecodeLeg, kv: dict[str, Any] | None, request_id: RequestIds, limit: float | None
    ) -> tuple[AsyncIterator[bytes], bytes]:
        """Post the decode leg and wait for its first bytes (a failure before them may be retried)."""
        timeouts = self.rt.compiled.config.timeouts
        endpoint = self.rt.compiled.by_name[leg.instance]
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=timeouts.connect_seconds, sock_read=timeouts.decode_idle_seconds
        )

        try:
            async with within(limit):
                upstream = leg.upstream = await self.legs.post(
                    f"{endpoint.url}{leg.request.path}",
                    data=json_bytes(decode_body(leg.body, kv)),
                    headers={**request_id.headers(), "Content-Type": JSON_CONTENT},
                    timeout=timeout,
                )
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
            async with within(limit):
                first = await anext(chunks, b"")
            leg.first_at = time.perf_counter()
        # aiohttp's read timeout is a ClientError *and* a TimeoutError: a failed leg, not a stalled pull
        except aiohttp.ClientError as exc:
            raise LegError(f"decode on {leg.instance} failed: {exc.__class__.__name__}") from None
        except TimeoutError:
            raise LegError(
                f"decode on {leg.instance} did not start within {limit:g} s: the KV pull across the link stalled"
            ) from None
        return chunks, first
