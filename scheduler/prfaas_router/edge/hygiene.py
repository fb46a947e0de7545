"""Connection hygiene of the router's and the gateway's listener: bounds no client can stretch.

aiohttp alone keeps a silent or slow connection open for an hour (its keep-alive default) and accepts any
number of them. Here (``RouterConfig.security``):

* a new connection must complete its TLS handshake and then its first request's headers within
  ``headerTimeoutSeconds`` (silent and slow-header connections are closed);
* a request body must arrive within ``bodyTimeoutSeconds`` (else ``408`` and the connection is closed);
* an idle keep-alive connection, or one whose next request's headers are still incomplete, is closed after
  ``keepaliveIdleSeconds`` (aiohttp's keep-alive timer, which runs from the last response);
* at most ``maxConnections`` connections are open per listener; past it new ones are closed at once; within it,
  each client (source address) and, on a gateway, the connections without the token and each token have their own
  budget (:mod:`.conn_budget`);
* a request line or header field longer than ``maxHeaderBytes``, or more than ``maxHeaders`` fields, is a 4xx.

A reloaded config changes every limit for the connections made after the reload (:meth:`Hygiene.configure`).

``prfaas_router_open_connections`` and ``prfaas_router_connections_closed_total{reason}`` show them at work.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from prfaas_core import names
from prfaas_core.api.router_config import RouterSecurity

from ..state.metrics import gauge
from ..state.wire import json_error

# --- Who holds the listener's connections: per-client and (gateway) per-token budgets under ``maxConnections``.


@dataclass(slots=True)
class Conn:
    source: str
    transport: asyncio.BaseTransport
    token: str | None = None
    """The key of the token it authenticated with (None: not yet)."""
    by_source: bool = True
    """Counted in its source's budget (until it authenticates on a gateway, or is evicted)."""


def source_of(transport: asyncio.BaseTransport) -> str:
    """The peer's address (its IP; ``""`` where there is none, e.g. a Unix socket)."""
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else ""


class ConnBudget:
    """The connections open on one listener by source and by token. ``authenticating``: a gateway with a token
    (connections move from their source's budget to their token's on their first authenticated request)."""

    def __init__(self, authenticating: bool = False) -> None:
        self.authenticating = authenticating
        self.conns: dict[object, Conn] = {}
        self.by_source: collections.Counter[str] = collections.Counter()
        self.by_token: collections.Counter[str] = collections.Counter()
        self.unauthenticated: dict[object, None] = {}
        """Gateway: the connections not yet authenticated, oldest first."""

    def admit(self, key: object, transport: asyncio.BaseTransport, limits: RouterSecurity) -> str | None:
        """A new connection: None when admitted, else why it is refused (``client_limit``). On a gateway an
        admitted one may push the oldest unauthenticated connection out (closed, counted by :meth:`evicted`)."""
        source = source_of(transport)
        per_client = limits.per_client()
        if self.authenticating:
            per_client = min(per_client, limits.unauthenticated())
        if self.by_source[source] >= per_client:
            return "client_limit"
        self.conns[key] = Conn(source, transport)
        self.by_source[source] += 1
        if self.authenticating:
            self.unauthenticated[key] = None
        return None

    def evict_over(self, limits: RouterSecurity) -> list[asyncio.BaseTransport]:
        """Gateway: the oldest unauthenticated connections past ``maxUnauthenticatedConnections``, taken out of the
        budgets (the caller closes them)."""
        out = []
        while len(self.unauthenticated) > limits.unauthenticated():
            key = next(iter(self.unauthenticated))
            conn = self.conns[key]
            self._leave_source(key, conn)
            out.append(conn.transport)
        return out

    def authenticated(self, key: object, token: str, limits: RouterSecurity) -> bool:
        """A request on ``key`` carried the token ``token`` (a key of it, not the token): False when the token's
        connections are at ``maxConnectionsPerToken`` already (the caller refuses and closes it)."""
        conn = self.conns.get(key)
        if conn is None or conn.token is not None or not self.authenticating:
            return True
        if self.by_token[token] >= limits.per_token():
            return False
        self._leave_source(key, conn)
        conn.token = token
        self.by_token[token] += 1
        return True

    def lost(self, key: object) -> None:
        conn = self.conns.pop(key, None)
        if conn is None:
            return
        self._leave_source(key, conn)
        if conn.token is not None:
            self.by_token[conn.token] -= 1
            if self.by_token[conn.token] <= 0:
                del self.by_token[conn.token]

    def _leave_source(self, key: object, conn: Conn) -> None:
        self.unauthenticated.pop(key, None)
        if conn.by_source:
            conn.by_source = False
            self.by_source[conn.source] -= 1
            if self.by_source[conn.source] <= 0:
                del self.by_source[conn.source]


# --- Connection hygiene of the router's and the gateway's listener: bounds no client can stretch

log = structlog.get_logger("prfaas.router")


class Hygiene:
    """The connection guard of one listener (one app, one runner, one site)."""

    def __init__(self, settings: RouterSecurity, registry: CollectorRegistry, authenticating: bool = False) -> None:
        """``authenticating``: a gateway with a token (:class:`ConnBudget`)."""
        self.settings = settings
        self.budget = ConnBudget(authenticating)
        self.open = gauge(
            names.METRIC_ROUTER_OPEN_CONNECTIONS, "Client connections open.", registry=registry, mode="livesum"
        )
        self.closed = Counter(
            names.METRIC_ROUTER_CONNECTIONS_CLOSED.removesuffix("_total"),
            "Client connections the listener closed on its own, by reason.",
            ["reason"],
            registry=registry,
        )
        self._pending: dict[object, asyncio.TimerHandle] = {}
        """Connections whose first request's headers have not arrived, with their deadline."""
        self._count = 0
        self._server: web.Server | None = None
        """The listener's server, once installed (its handler arguments follow a reload)."""

    def configure(self, settings: RouterSecurity) -> None:
        """A reloaded config: every limit applies to the connections (and requests) that start after it.

        aiohttp's own limits (keep-alive, request line, header size and count) are handed to each connection's
        handler when the connection is made, from the server's handler arguments: those are replaced here, so
        connections already open keep the limits they were accepted with (their parser is built). The one
        exception is the TLS handshake's bound, which asyncio fixes when the listening socket is created: it
        keeps the start-time ``headerTimeoutSeconds`` (the first request's headers follow the new one)."""
        self.settings = settings
        if self._server is not None:
            self._server._kwargs.update(self.runner_kwargs())

    def runner_kwargs(self) -> dict[str, Any]:
        s = self.settings
        return {
            "keepalive_timeout": s.keepalive_idle_seconds,
            "max_line_size": s.max_header_bytes,
            "max_field_size": s.max_header_bytes,
            "max_headers": s.max_headers,
        }

    # --- the server's connection hooks ---------------------------------------------------------------------
    def install(self, server: web.Server) -> None:
        self._server = server
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler: Any, transport: asyncio.Transport) -> None:
            made(handler, transport)
            self._count += 1
            self.open.set(self._count)
            if self._count > self.settings.max_connections:
                self.closed.labels("limit").inc()
                transport.close()
                return
            refused = self.budget.admit(handler, transport, self.settings)
            if refused is not None:
                self.closed.labels(refused).inc()
                transport.close()
                return
            for old in self.budget.evict_over(self.settings):
                self.closed.labels("unauthenticated").inc()
                old.close()
            loop = asyncio.get_running_loop()
            self._pending[handler] = loop.call_later(
                self.settings.header_timeout_seconds, self._expire, handler, transport
            )

        def connection_lost(handler: Any, exc: BaseException | None = None) -> None:
            lost(handler, exc)
            self.budget.lost(handler)
            timer = self._pending.pop(handler, None)
            if timer is not None:
                timer.cancel()
            self._count -= 1
            self.open.set(self._count)

        server.connection_made = connection_made  # type: ignore[method-assign]
        server.connection_lost = connection_lost  # type: ignore[method-assign]

    def authenticated(self, request: web.Request, token_key: str) -> bool:
        """A request carried the token (keyed ``token_key``): its connection joins the token's budget. False: that
        budget is full (counted; the caller answers 503 and closes the connection)."""
        if self.budget.authenticated(request.protocol, token_key, self.settings):
            return True
        self.closed.labels("token_limit").inc()
        return False

    def _expire(self, handler: object, transport: asyncio.Transport) -> None:
        if self._pending.pop(handler, None) is not None and not transport.is_closing():
            self.closed.labels("header_timeout").inc()
            transport.close()

    def middleware(self) -> Callable[..., Awaitable[web.StreamResponse]]:
        @web.middleware
        async def guard(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            timer = self._pending.pop(request.protocol, None)
            if timer is not None:
                timer.cancel()
            if request.can_read_body and request.content.is_eof():  # the whole body is here: no wait to time
                await request.read()
            elif request.can_read_body:
                try:  # a timeout scope, not wait_for: no task per request
                    async with asyncio.timeout(self.settings.body_timeout_seconds):
                        await request.read()
                except TimeoutError:
                    self.closed.labels("body_timeout").inc()
                    resp = json_error(408, f"request body not received within {self.settings.body_timeout_seconds:g} s")
                    resp.force_close()
                    return resp
            return await handler(request)

        return guard


class GuardedSite(web.TCPSite):
    """A TCP site whose TLS handshakes are bounded by the header timeout too."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, hygiene: Hygiene, **kwargs: Any) -> None:
        super().__init__(runner, host, port, **kwargs)
        self._hygiene = hygiene

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        tls: ssl.SSLContext | None = self._ssl_context
        self._server = await loop.create_server(
            server,
            self._host,
            self._port,
            ssl=tls,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
            ssl_handshake_timeout=self._hygiene.settings.header_timeout_seconds if tls is not None else None,
        )


async def start_listener(
    app: web.Application,
    hygiene: Hygiene,
    host: str,
    port: int,
    tls: ssl.SSLContext | None,
    reuse_port: bool = False,
    side_port: int | None = None,
) -> tuple[web.AppRunner, GuardedSite]:
    """The runner and site of one listener, with the guard installed. ``reuse_port``: the port is shared with other
    worker processes (SO_REUSEPORT: the kernel spreads the connections); ``side_port``: the same app also on
    127.0.0.1 there, this worker's own address for its siblings."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, **hygiene.runner_kwargs())
    await runner.setup()
    assert runner.server is not None
    hygiene.install(runner.server)
    site = GuardedSite(runner, host, port, hygiene, ssl_context=tls, backlog=4096, reuse_port=reuse_port or None)
    await site.start()
    if side_port is not None:
        await GuardedSite(runner, "127.0.0.1", side_port, hygiene, ssl_context=tls).start()
    return runner, site
