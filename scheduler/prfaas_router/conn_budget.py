"""Who holds the listener's connections: per-client and (gateway) per-token budgets under ``maxConnections``.

One source address holds at most ``maxConnectionsPerClient`` connections, so no one client exhausts the listener
(issue: one client holding ~4,200 idle connections locked every other out of a router and a gateway, and the router's
status polls to its gateway then failed and opened its breaker). On a gateway with a token the budgets follow the
credential: a connection is *unauthenticated* from its accept until a request on it carries the bearer token; those
count against their source (``maxConnectionsPerClient``) and all together against ``maxUnauthenticatedConnections``
(past it the oldest is closed to make room: a router authenticates with its first request, milliseconds after its
connect, while a flood's idle connections are old). An authenticated connection leaves its source's count and
counts against its token's (``maxConnectionsPerToken``), the routers' reserved share: a flood without the token
never reaches it, and routers behind one NAT address are not held to one client's budget.

Pure bookkeeping over opaque connection keys and transports; :mod:`.hygiene` calls it from the server's hooks.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass

from prfaas_core.api.router_config import RouterSecurity


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
        self.by_source: Counter[str] = Counter()
        self.by_token: Counter[str] = Counter()
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
