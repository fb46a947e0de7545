"""The router's HTTP helpers, shared by the proxy (router mode) and the gateway: OpenAI-style error bodies,
the JSON bodies of the legs, the legs' client session, bearer tokens read from files."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import orjson
import structlog
from aiohttp import web

log = structlog.get_logger("prfaas.router")


def json_bytes(obj: Any) -> bytes:
    """A leg's body: orjson is ~15x faster than json on the long token-id lists prompts carry."""
    return orjson.dumps(obj)


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
