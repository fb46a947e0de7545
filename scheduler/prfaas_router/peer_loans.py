"""The calls between gateway replicas that lend each other their idle share of a link (:mod:`.admission`;
:data:`~prfaas_core.names.LOANS_PATH`), with the gateway's own bearer token, and the forwarding of a pull report
that reached the wrong replica."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import ssl
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx
import structlog

from prfaas_core import names

log = structlog.get_logger("prfaas.router.admission")

PEER_TIMEOUT_S = 1.0
"""A call between gateway replicas (wall seconds); a peer that does not answer in time lends nothing."""
RESOLVE_EVERY_S = 5.0
"""The peers' addresses (who may borrow) are resolved again at most this often (wall seconds)."""


def _canonical(address: str) -> str:
    """An IP address as one spelling (an IPv4-mapped IPv6 address as its IPv4 form); others unchanged."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def peer_tls(ca_file: str | None) -> ssl.SSLContext:
    """What verifies the peers: ``ca_file`` (a path given to httpx is deprecated there), or the system's CAs when it is
    unset or unreadable. Unreadable (the chart mounts the CA Secret optional) is logged, not fatal: peers a private
    CA signed are then unreachable, and this replica keeps its own share of the cap (exact, slower)."""
    if ca_file:
        try:
            return ssl.create_default_context(cafile=ca_file)
        except (OSError, ssl.SSLError) as exc:
            log.error("gateway peer CA unreadable: peers it signed are unreachable", ca_file=ca_file, error=str(exc))
    return ssl.create_default_context()


class PeerLoans:
    """The calls a replica makes to its peers (:data:`~prfaas_core.names.LOANS_PATH`) with the gateway's own bearer
    token. A peer that answers 409 is this replica (``peers`` may list every replica): it is skipped from then on."""

    def __init__(self, urls: list[str], token: Callable[[], bytes | None], ca_file: str | None = None) -> None:
        self.urls = list(urls)
        self.token = token
        self.ids: dict[str, str] = {}
        """Peer URL -> its replica id, learned from its answers."""
        self.self_urls: set[str] = set()
        self.ca_file = ca_file
        self.http = httpx.AsyncClient(timeout=PEER_TIMEOUT_S, verify=peer_tls(ca_file))
        self._addresses: frozenset[str] = frozenset()
        self._resolved: tuple[tuple[str, ...], float] | None = None
        """(the URLs resolved, when)."""

    async def is_peer(self, remote: str | None) -> bool:
        """Whether a caller at ``remote`` (its IP address) is one of the configured peers: one of the addresses
        their URLs' hosts resolve to (re-resolved every :data:`RESOLVE_EVERY_S` while a caller is not found)."""
        if not remote:
            return False
        who = _canonical(remote)
        if who in self._addresses:
            return True
        now = time.monotonic()
        urls = tuple(self.urls)
        if self._resolved is not None and self._resolved[0] == urls and now - self._resolved[1] < RESOLVE_EVERY_S:
            return False
        self._resolved = (urls, now)
        loop = asyncio.get_running_loop()
        found: set[str] = set()
        for url in urls:
            host = urlsplit(url).hostname
            if not host:
                continue
            try:
                infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            except OSError as exc:
                log.warning("gateway peer unresolvable: it cannot borrow", peer=url, error=str(exc))
                continue
            found.update(_canonical(str(info[4][0])) for info in infos)
        self._addresses = frozenset(found)
        return who in self._addresses

    def others(self) -> list[str]:
        return [u for u in self.urls if u not in self.self_urls]

    def _headers(self) -> dict[str, str]:
        token = self.token()
        return {"Authorization": f"Bearer {token.decode()}"} if token else {}

    async def ask(
        self, url: str, link: str, fraction: float, lease_s: float, replica: str, held_at: float
    ) -> tuple[str, float] | None:
        """Ask ``url`` to lend up to ``fraction``: ``(loan id, granted)`` (0 granted: refused), or None
        (unreachable, or itself)."""
        body = {"fraction": fraction, "leaseS": lease_s, "replica": replica, "heldAt": held_at}
        try:
            resp = await self.http.post(url + names.LOANS_PATH.format(link=link), json=body, headers=self._headers())
        except httpx.HTTPError as exc:
            log.warning("gateway peer unreachable: it lends nothing", peer=url, error=exc.__class__.__name__)
            return None
        if resp.status_code == 409:
            self.self_urls.add(url)
            return None
        if resp.status_code != 200:  # a peer on another link, or another version: it lends nothing
            log.warning("gateway peer refused a loan request", peer=url, status=resp.status_code, body=resp.text[:200])
            return "", 0.0
        answer = resp.json()
        self.ids[url] = str(answer.get("replica", ""))
        return str(answer["loanId"]), float(answer["granted"])

    async def give_back(self, url: str, link: str, loan_id: str) -> bool:
        """Best effort: a loan not given back returns to its lender when its lease runs out. False: unreachable."""
        try:
            await self.http.delete(url + names.LOAN_PATH.format(link=link, loan_id=loan_id), headers=self._headers())
        except httpx.HTTPError as exc:
            log.warning(
                "gateway peer unreachable: its loan returns by its lease", peer=url, error=exc.__class__.__name__
            )
            return False
        return True

    async def report_done(self, pull_id: str) -> httpx.Response | None:
        """Forward a pull report to the peer whose id the pull's id starts with (each other peer in turn while that
        one is not known yet): its answer, or None (no peer has it on the wire)."""
        owner = pull_id.split(".", 1)[0]
        known = [u for u, rid in self.ids.items() if rid == owner]
        path = names.PULL_DONE_PATH.format(pull_id=pull_id)
        for url in known or [u for u in self.others() if u not in self.ids]:
            try:
                resp = await self.http.post(url + path, headers={**self._headers(), names.HEADER_FORWARDED: "1"})
            except httpx.HTTPError:
                continue
            if resp.status_code != 404:
                return resp
        return None

    async def aclose(self) -> None:
        await self.http.aclose()

    def close_soon(self) -> None:
        """Close from synchronous code (a config reload inside the event loop)."""
        with contextlib.suppress(RuntimeError):  # no running loop: nothing was ever sent on it
            asyncio.get_running_loop().create_task(self.aclose())
