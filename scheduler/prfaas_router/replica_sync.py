"""Router replicas in front of one PD cluster share their PD prefill books (:mod:`prfaas_core.policy.replica_books`).

Each replica ``PUT``\\ s its books to every peer (:data:`~prfaas_core.names.REPLICA_BOOKS_PATH`) as soon as they
change (a local prefill starts or ends) and every :data:`~prfaas_core.policy.replica_books.HEARTBEAT_S` otherwise;
rounds are serialised and start :data:`MIN_ROUND_S` apart at least, so a burst of changes goes as one body. Peers
are static base URLs (``--peers``), and/or the addresses a DNS name resolves to (``--peers-dns NAME:PORT``: the
chart's headless ``<release>-router-peers`` Service, re-resolved every :data:`DNS_REFRESH_S`, so replicas that
scale in or out are found). A replica that receives its own id answers 409 and is skipped from then on (it may be
listed, or resolved, among its peers).

A peer that does not answer costs one :data:`PEER_TIMEOUT_S` per send and nothing else: its books expire from the
others' view and the engines' scraped counts stand for its work again (the behaviour without sync).

**Who may send books.** The path shares the router's port with its clients, and books steer its routing, so with
``--peers-token-file`` (the chart's ``replicaSync.tokenSecret``) a replica sends ``Authorization: Bearer <token>``
and takes books only with it (401 otherwise, constant-time compare); the file is polled, and a rotated token is in
force at once while the previous one is accepted :data:`TOKEN_OVERLAP_S` longer. Without it, anyone who reaches the
port may send books (warned at start).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from dataclasses import dataclass

import httpx
import structlog
from aiohttp import web
from pydantic import ValidationError

from prfaas_core import names
from prfaas_core.api import InstanceBookWire, ReplicaBooksWire
from prfaas_core.policy.replica_books import HEARTBEAT_S, Book, InstanceBook

from .http_util import json_error
from .metrics import RouterMetrics
from .runtime import Runtime
from .security import SecurityMetrics, TokenAuth

log = structlog.get_logger("prfaas.router.replicas")

PEER_TIMEOUT_S = 0.5
"""One send to one peer (wall seconds)."""
DNS_REFRESH_S = 5.0
"""How often ``--peers-dns`` is resolved again (wall seconds)."""
MIN_ROUND_S = 0.02
"""Two send rounds start at least this far apart (wall seconds): a busy router's many changes go as one body per
round (a few hundred requests a second would otherwise cost that many PUTs per peer), 20 ms stale at most."""
TOKEN_POLL_S = 5.0
"""How often ``--peers-token-file`` is checked for a rotated token (wall seconds)."""
TOKEN_OVERLAP_S = 30.0
"""A rotated-out token is still taken this long (wall seconds): the replicas see the new file at different times."""


@dataclass(frozen=True)
class ReplicaPeers:
    """The other router replicas (``--peers``, ``--peers-dns``) and the shared token (``--peers-token-file``)."""

    urls: tuple[str, ...] = ()
    dns: tuple[str, int] | None = None
    token_file: str | None = None


NO_PEERS = ReplicaPeers()


def to_wire(book: Book) -> ReplicaBooksWire:
    return ReplicaBooksWire(
        replica=book.replica,
        seq=book.seq,
        instances={
            name: InstanceBookWire(in_flight=i.in_flight, started=i.started, seconds=i.seconds)
            for name, i in book.instances.items()
        },
    )


def from_wire(wire: ReplicaBooksWire) -> Book:
    return Book(
        wire.replica,
        wire.seq,
        {name: InstanceBook(i.in_flight, i.started, i.seconds) for name, i in wire.instances.items()},
    )


def parse_peers_dns(value: str | None) -> tuple[str, int] | None:
    """``NAME:PORT`` (empty or None: no DNS peers); a ValueError names what is wrong."""
    if not value:
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--peers-dns wants NAME:PORT (e.g. prfaas-router-peers.prfaas.svc:8080), got {value!r}")
    return host, int(port)


class ReplicaSync:
    """Sends this replica's books to its peers and takes theirs (:meth:`receive`)."""

    def __init__(
        self,
        runtime: Runtime,
        metrics: RouterMetrics,
        peers: ReplicaPeers = NO_PEERS,
        security: SecurityMetrics | None = None,
    ) -> None:
        self.runtime, self.metrics = runtime, metrics
        self.static = [u.rstrip("/") for u in peers.urls]
        self.dns = peers.dns
        self.token = TokenAuth(
            peers.token_file,
            security or SecurityMetrics(metrics.registry),
            TOKEN_OVERLAP_S,
            source="--peers-token-file",
            credential="peers_token",
        )
        """Raises ValueError when the file is unreadable or empty."""
        self._token_polled = time.monotonic()
        self.resolved: list[str] = []
        self._resolved_at = float("-inf")
        self.self_urls: set[str] = set()
        self._changed = asyncio.Event()
        runtime.books_changed = self._changed.set
        self.http = httpx.AsyncClient(timeout=PEER_TIMEOUT_S)

    @property
    def enabled(self) -> bool:
        return bool(self.static or self.dns)

    async def _targets(self) -> list[str]:
        if self.dns is not None and time.monotonic() - self._resolved_at >= DNS_REFRESH_S:
            host, port = self.dns
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:  # no replica ready yet, or DNS down: keep the last answer
                log.warning("router peers unresolvable", name=host, error=str(exc))
            else:
                addrs = sorted({str(info[4][0]) for info in infos})
                self.resolved = [f"http://[{a}]:{port}" if ":" in a else f"http://{a}:{port}" for a in addrs]
            self._resolved_at = time.monotonic()
        return [u for u in dict.fromkeys(self.static + self.resolved) if u not in self.self_urls]

    async def _put(self, url: str, body: bytes) -> str:
        headers = {"Content-Type": "application/json"}
        if self.token.token is not None:
            headers["Authorization"] = "Bearer " + self.token.token.decode()
        try:
            resp = await self.http.put(url + names.REPLICA_BOOKS_PATH, content=body, headers=headers)
        except httpx.HTTPError:
            return "unreachable"
        if resp.status_code == 409:
            self.self_urls.add(url)
            return "self"
        if resp.status_code == 401:
            log.warning("router peer refused our token", peer=url, body=resp.text[:200])
            return "unauthorized"
        if resp.status_code != 204:
            log.warning("router peer refused our books", peer=url, status=resp.status_code, body=resp.text[:200])
            return "refused"
        return "sent"

    async def send(self) -> None:
        """This replica's books to every peer at once."""
        body = to_wire(self.runtime.own_book()).model_dump_json(by_alias=True).encode()
        for result in await asyncio.gather(*(self._put(u, body) for u in await self._targets())):
            self.metrics.replica_sync.labels(result).inc()
        self._export()

    def _export(self) -> None:
        rt, m = self.runtime, self.metrics
        now = rt.clock()
        m.replica_peers.set(len(rt.peer_books.live(now)))
        for e in rt.compiled.prefill:
            m.replica_peer_prefill.labels(e.name).set(rt.peer_books.seconds(e.name, now))

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop``: send on every change, and every heartbeat."""
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), HEARTBEAT_S)
            started = time.monotonic()
            self._changed.clear()
            try:
                if started - self._token_polled >= TOKEN_POLL_S:
                    self._token_polled = started
                    self.token.poll()
                await self.send()
            except Exception:  # a failed round is retried at the next change or heartbeat; never kill the loop
                log.exception("router replica sync failed")
            rest = MIN_ROUND_S - (time.monotonic() - started)
            if rest > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), rest)

    async def receive(self, request: web.Request) -> web.Response:
        """``PUT`` :data:`~prfaas_core.names.REPLICA_BOOKS_PATH`: a peer's books (400 when malformed, 409 when
        they are this replica's own; 401 without the peers' token, when one is set)."""
        refused = self.token.refusal(request.headers.get("Authorization"))
        if refused is not None:
            log.warning("replica books refused", reason=refused, peer=request.remote)
            return json_error(401, f"replica books: {refused} bearer token (the replicas' --peers-token-file)")
        try:
            wire = ReplicaBooksWire.model_validate_json(await request.read())
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            return json_error(400, f"replica books: {where}: {first['msg']}")
        if wire.replica == self.runtime.replica:
            return json_error(409, "these are this replica's own books")
        self.runtime.peer_books.heard(from_wire(wire), self.runtime.clock())
        self._export()
        return web.Response(status=204)

    async def aclose(self) -> None:
        self.runtime.books_changed = None
        await self.http.aclose()
