"""What travels on the wire, shared by the proxy (router mode) and the gateway: OpenAI-style error bodies,
the JSON bodies of the legs and the KV handle (the engine kind's, through :func:`prfaas_core.launch.kinds.engine_kind`),
the legs' client session, bearer tokens read from files, the cutting short of legs to a side that turned unready,
and ``Server-Timing``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Awaitable, Generator, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import aiohttp
import httpx
import orjson
import structlog
from aiohttp import web

from prfaas_core import names
from prfaas_core.launch.kinds import engine_kind
from prfaas_core.request.params import check_context

# --- The legs of the disaggregated-serving exchange, as a proxy drives them: the prefill leg (one token, a request
# for a KV handle), whose answer carries the handle, and the decode leg (the client's body plus that handle), whose
# response is the client's answer. The bodies and the handle are the engine kind's
# (:mod:`prfaas_core.launch.vllm`, through :func:`prfaas_core.launch.kinds.engine_kind`).

ENGINE = engine_kind()
"""The engine kind the legs speak to."""


class LegError(Exception):
    """A leg failed before the client's response started; ``retriable`` if another side may succeed."""

    def __init__(self, message: str, status: int = 502, retriable: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.retriable = retriable


prefill_body = ENGINE.prefill_body
decode_body = ENGINE.decode_body


LINK_HEADER = names.HEADER_LINK
"""The link a remote prefill crosses (router -> gateway); the gateway labels its egress with it and never forwards
it to the engine."""
LINK_LABEL = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
UNKNOWN_LINK = "unknown"
"""The gateway's link label for a prefill whose caller named no (valid) link."""


def reported_prompt_tokens(response: Any, fallback: int) -> int:
    """The prompt tokens the engine reported in its answer (``usage.prompt_tokens``; raw bytes or parsed JSON), or
    ``fallback`` (the caller's own count) when the answer carries none."""
    if isinstance(response, bytes | str):
        try:
            response = json.loads(response)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return fallback
    usage = response.get("usage") if isinstance(response, dict) else None
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0 else fallback


def kv_handle(response_json: Any) -> dict[str, Any]:
    """The KV handle of a prefill response; a response without one is an error (never a silent success)."""
    if not isinstance(response_json, dict):
        raise LegError("prefill response is not a JSON object")
    handle = ENGINE.kv_handle(response_json)
    if handle is None:
        raise LegError("prefill response carries no KV handle")
    return handle


# --- Cutting short the legs in flight to a side that turned unready: a remote whose status says it has no ready
# instance (the router), an engine after its consecutive failed probes (the gateway). Without this, a request
# already dispatched to a frozen engine waits out the leg's full timeout before falling back; with it, the leg is
# cancelled at the refresh that saw the change (within seconds) and the caller re-routes it.

T = TypeVar("T")


def remote_side(name: str) -> str:
    return f"remote:{name}"


def engine_side(name: str) -> str:
    return f"engine:{name}"


class SideLost(Exception):
    """The side a leg was sent to turned unready while the leg was in flight."""


class Aborts:
    """Legs in flight by the side they went to; :meth:`abort` cancels every one of a side."""

    def __init__(self) -> None:
        self._waiting: dict[str, set[asyncio.Future[str]]] = {}

    async def run(self, side: str, leg: Awaitable[T]) -> T:
        """Await ``leg``; SideLost (with the reason) if ``side`` is aborted first (the leg is cancelled)."""
        lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        waiting = self._waiting.setdefault(side, set())
        waiting.add(lost)
        task = asyncio.ensure_future(leg)
        try:
            racing: set[asyncio.Future[Any]] = {task, lost}
            done, _ = await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
            if task in done:
                return task.result()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise SideLost(lost.result())
        finally:
            if not task.done():
                task.cancel()
            waiting.discard(lost)
            if not lost.done():
                lost.cancel()

    def abort(self, side: str, why: str) -> int:
        """Cancel the legs in flight to ``side``; how many there were."""
        waiting = self._waiting.get(side, set())
        n = 0
        for lost in list(waiting):
            if not lost.done():
                lost.set_result(why)
                n += 1
        return n

    def in_flight(self, side: str) -> int:
        return len(self._waiting.get(side, ()))


# --- ``Server-Timing`` (W3C) on the gateway's and the router's answers: where a request's time went, per phase
# (:data:`~prfaas_core.names.SERVER_TIMING` names the entries). Durations are wall milliseconds.

GATEWAY_PREFIX = "gw-"
"""The router passes the gateway's entries on under this prefix."""


def timing_entry(name: str, seconds: float) -> str:
    return f"{name};dur={max(0.0, seconds) * 1000.0:.1f}"


def timing_header(entries: Iterable[tuple[str, float]]) -> str:
    """``name;dur=ms, ...`` from (name, wall seconds) pairs."""
    return ", ".join(timing_entry(name, s) for name, s in entries)


def timing_prefixed(value: str | None, prefix: str = GATEWAY_PREFIX) -> list[str]:
    """Another hop's entries, each renamed ``prefix + name`` (malformed ones dropped)."""
    out = []
    for part in (value or "").split(","):
        name, _, rest = part.strip().partition(";")
        if name and all(c.isalnum() or c in "-_" for c in name):
            out.append(prefix + name + (";" + rest if rest else ""))
    return out


def parse_timing(value: str | None) -> dict[str, float]:
    """``{name: ms}`` of a ``Server-Timing`` value (entries without a ``dur`` are left out)."""
    out: dict[str, float] = {}
    for part in (value or "").split(","):
        name, *params = (p.strip() for p in part.split(";"))
        for param in params:
            key, _, val = param.partition("=")
            if key == "dur":
                with contextlib.suppress(ValueError):
                    out[name] = float(val)
    return out


# --- The router's HTTP helpers, shared by the proxy (router mode) and the gateway

log = structlog.get_logger("prfaas.router")


def json_bytes(obj: Any) -> bytes:
    """A leg's body: orjson is ~15x faster than json on the long token-id lists prompts carry."""
    return orjson.dumps(obj)


_NO_LIMIT = contextlib.nullcontext()


def within(seconds: float | None) -> contextlib.AbstractAsyncContextManager[Any]:
    """A timeout scope (``TimeoutError`` past ``seconds``), none for None: ``asyncio.wait_for`` made a task per
    call, and even an unlimited ``asyncio.timeout`` costs a timer object per request."""
    return asyncio.timeout(seconds) if seconds is not None else _NO_LIMIT


JSON_CONTENT = "application/json"
CLIENT_KEEPALIVE_S = 4.0
"""How long the router's and gateway's clients keep an idle connection: below every server's idle timeout."""


def error_body(status: int, message: str, kind: str = "invalid_request_error") -> dict[str, object]:
    """OpenAI's error object: ``{"error": {"message", "type", "code"}}``."""
    return {"error": {"message": message, "type": kind, "code": status}}


def json_error(status: int, message: str, kind: str = "invalid_request_error", **headers: str) -> web.Response:
    return web.json_response(error_body(status, message, kind), status=status, headers=headers or None)


def model_not_found(model: object) -> web.Response:
    """OpenAI's answer to a model it does not serve (404, ``model_not_found``)."""
    body = {
        "error": {
            "message": f"The model `{model}` does not exist or you do not have access to it.",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
    return web.json_response(body, status=404)


def is_chat(path: str) -> bool:
    return path.endswith("/chat/completions")


def read_token(path: str | None) -> str | None:
    return Path(path).read_text(encoding="utf-8").strip() if path else None


def new_session(limit: int = 4096) -> aiohttp.ClientSession:
    """The legs' HTTP client (aiohttp: its connection pool costs O(1) per request, httpx's scans every pooled
    connection, which capped the plain-proxy rate at a few hundred requests per second). Bodies pass through
    as the engines sent them (no decompression); timeouts are set per leg. Idle pooled connections are dropped
    after :data:`CLIENT_KEEPALIVE_S`, before the servers drop them (uvicorn/vLLM after 5 s, our listener after
    ``security.keepaliveIdleSeconds``): reusing a connection the server is closing at that instant fails the
    leg with a read error."""
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0, keepalive_timeout=CLIENT_KEEPALIVE_S)
    return aiohttp.ClientSession(connector=connector, auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None))


STALE_CONNECTION = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
"""How a leg fails when the pooled connection it went out on was closed by the server before any byte of an
answer (the keep-alive race; ``ClientConnectorError``, a failed connect, is a subclass and is excluded)."""


class LegSession:
    """The legs' client: an aiohttp session whose POSTs are sent once more, on a fresh connection, when the
    pooled connection they went out on was closed under them before any byte of an answer came back.

    That is the keep-alive race: the server closes an idle connection at the instant the client reuses it,
    and the server never read the request. aiohttp resends in that case by itself for idempotent methods only;
    the legs (prefill, and a decode that has not answered) are safe to resend: the request id keys the
    accounting, and a server that had read the request would have answered or the next connect fails. Once,
    and never a failed connect (that is an engine or gateway that is down: the caller's fallback handles it).
    """

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    @classmethod
    def open(cls, limit: int = 4096) -> LegSession:
        return cls(new_session(limit))

    def post(self, url: str, **kwargs: Any) -> _Leg:
        """Awaitable (the response) or an async context manager (released on exit), like aiohttp's."""
        return _Leg(self.session, url, kwargs)

    async def close(self) -> None:
        await self.session.close()


class _Leg:
    def __init__(self, session: aiohttp.ClientSession, url: str, kwargs: dict[str, Any]) -> None:
        self._session, self._url, self._kwargs = session, url, kwargs
        self._resp: aiohttp.ClientResponse | None = None

    async def _send(self) -> aiohttp.ClientResponse:
        try:
            return await self._session.post(self._url, **self._kwargs)
        except aiohttp.ClientConnectorError:
            raise
        except STALE_CONNECTION as exc:
            log.info("leg's connection closed before an answer; sent once more", url=self._url, error=repr(exc))
            return await self._session.post(self._url, **self._kwargs)

    def __await__(self) -> Generator[Any, None, aiohttp.ClientResponse]:
        return self._send().__await__()

    async def __aenter__(self) -> aiohttp.ClientResponse:
        self._resp = await self._send()
        return self._resp

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._resp is not None:
            await self._resp.__aexit__(exc_type, exc, tb)


CONTEXT_ASK_S = 2.0
"""While the context length is unknown, the engines' ``/v1/models`` are asked at most this often (wall s)."""


class ContextLength:
    """The model's context length, the least ``max_model_len`` the engines' ``/v1/models`` name (vLLM's answer and
    the emulator's): learned at start and on every reload (the engines may change), asked again while unknown."""

    def __init__(self) -> None:
        self.max_model_len: int | None = None
        self._asked = -CONTEXT_ASK_S
        self._task: asyncio.Task[None] | None = None  # the loop keeps only weak references to tasks

    def learn(self, http: Any, endpoints: Iterable[Any]) -> None:
        self._asked = time.monotonic()
        urls = [e.url for e in endpoints]
        self._task = asyncio.get_running_loop().create_task(self._learn(http, urls))

    def check(self, body: dict[str, Any], chat: bool, prompt_tokens: int, http: Any, endpoints: Iterable[Any]) -> None:
        """:func:`~prfaas_core.request.params.check_context` (ValueError past it); unknown: the engines are asked."""
        if self.max_model_len is not None:
            check_context(body, chat, prompt_tokens, self.max_model_len)
        elif time.monotonic() - self._asked >= CONTEXT_ASK_S:
            self.learn(http, endpoints)

    async def _learn(self, http: Any, urls: list[str]) -> None:
        lens: list[int] = []
        for url in urls:
            try:
                data = (await http.get(f"{url}/v1/models", timeout=CONTEXT_ASK_S)).json()["data"]
                lens += [m["max_model_len"] for m in data if isinstance(m.get("max_model_len"), int)]
            except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
                continue
        if lens:
            self.max_model_len = min(lens)
