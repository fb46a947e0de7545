"""The decode leg's answer to the client, whole or streamed (a break mid-stream ends it with an error event),
the leg's context, and the response headers naming the route."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from prfaas_core import names
from prfaas_core.api.common import SloSpec

from . import server_timing
from .legs import LegError
from .metrics import FAILURE_KINDS, RouterMetrics, judge_ttft

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

    def headers(self) -> dict[str, str]:
        out = {ROUTE_HEADER: self.route, PROMPT_TOKENS_HEADER: str(self.prompt_tokens)}
        phases = (("prefill", self.prefilled), ("first", self.first_at))
        entries = [server_timing.entry(name, at - self.started) for name, at in phases if at is not None]
        entries += server_timing.prefixed(self.gateway_timing)
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
    m.e2e.labels(route).observe(time.perf_counter() - leg.started)
    m.requests.labels(route, "ok").inc()
    return web.Response(body=data, status=200, content_type="application/json", headers=leg.headers())


async def answer_stream(
    m: RouterMetrics, leg: DecodeLeg, chunks: AsyncIterator[bytes], first: bytes, slo: SloSpec | None = None
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
    # every event, [DONE] last, is on its way: the answer is complete, whatever happens to the stream's end marker
    # (a client such as the OpenAI SDK closes as soon as it reads [DONE], and write_eof then meets a closing
    # transport: before, such a stream counted as cancelled and its TPOT was never observed)
    if events > 2:  # the last event is [DONE]
        m.tpot.labels(route).observe((last_at - first_at) / (events - 2))
    m.e2e.labels(route).observe(time.perf_counter() - leg.started)
    m.requests.labels(route, "ok").inc()
    with contextlib.suppress(ConnectionResetError):
        await out.write_eof()
    return out
