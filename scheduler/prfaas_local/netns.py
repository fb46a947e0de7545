"""Two "datacenters" on one machine: two network namespaces joined by a veth pair, shaped in the kernel by ``tbf``.

Region A and region B each get a namespace of their own (unique names ``prfaas-<pid>-<n>-a``/``-b``), a loopback
that is up (vLLM's API server and EngineCore talk over it), and one end of a veth pair with an address from a
private /30 (``10.213.<n>.1`` and ``.2``) that exists only inside those namespaces. Each end's egress is shaped by
a token bucket (``tc qdisc … tbf rate R burst B latency L``): rate and burst are real kernel shaping; this kernel
has no ``netem``, so no delay or loss from tc. The kernel's byte counters of each end (``ip -s link``: every byte
that crossed, HTTP and KV alike) are read with :meth:`NetnsPair.counters`.

:meth:`NetnsPair.cut` takes both ends down (the connected routes go, a connect fails at once with "network
unreachable"); :meth:`NetnsPair.restore` brings them up again (addresses and qdiscs stay).

Processes run inside a namespace through :meth:`NetnsPair.exec_prefix` (``ip netns exec``). The test process
itself stays in the root namespace and reaches a listener inside one through :meth:`NetnsPair.expose`: a TCP
forwarder on 127.0.0.1 whose outgoing sockets are opened by a thread that entered the namespace (``setns``), so
nothing in the root namespace gets an address.

Teardown: :meth:`NetnsPair.close` (also the context manager's exit, an ``atexit`` hook and SIGTERM/SIGINT) ends
what still runs inside the namespaces and deletes them (deleting a namespace deletes its veth end, and so the
pair). :func:`clean_leftovers` deletes the namespaces of earlier runs whose process is gone (a SIGKILLed run).
Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN); :class:`NetnsUnavailable` says why when it cannot.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import count
from types import FrameType
from typing import Any, Literal

PREFIX = "prfaas-"
"""Every namespace this module makes is named ``prfaas-<pid>-<n>-a|b``."""
SUBNET = "10.213"
"""Private range of the pairs' /30s (10.213.<n>.0/30); only ever assigned inside our own namespaces."""
CLONE_NEWNET = 0x40000000
Side = Literal["a", "b"]
SIDES: tuple[Side, ...] = ("a", "b")
_NAME = re.compile(r"^prfaas-(\d+)-(\d+)-[ab]$")
_seq = count()


class NetnsUnavailable(RuntimeError):
    """Network namespaces, veth or tc cannot be used here (the message says why)."""


@dataclass(frozen=True)
class LinkShape:
    """The token bucket on each veth end's egress (``tc … tbf``).

    rate_mbit: sustained rate in Mbit/s (10^6 bit/s, tc's ``mbit``); burst_bytes: the bucket (bytes that may
    leave at line rate after an idle spell; at least one MTU-sized packet); latency_ms: how long a packet may
    wait in the queue before tbf drops it (sets the queue's length)."""

    rate_mbit: float = 40.0
    burst_bytes: int = 32_768
    latency_ms: float = 200.0

    def __post_init__(self) -> None:
        if not 0.01 <= self.rate_mbit <= 100_000:
            raise ValueError(f"rate_mbit must be in [0.01, 100000], got {self.rate_mbit}")
        if not 1600 <= self.burst_bytes <= 64 * 1024 * 1024:
            raise ValueError(f"burst_bytes must be in [1600, 64 MiB] (at least one packet), got {self.burst_bytes}")
        if not 1 <= self.latency_ms <= 60_000:
            raise ValueError(f"latency_ms must be in [1, 60000], got {self.latency_ms}")

    @property
    def bytes_per_s(self) -> float:
        return self.rate_mbit * 1e6 / 8

    def tbf_args(self) -> list[str]:
        """``tc qdisc add dev DEV root`` + these."""
        rate_kbit = max(1, round(self.rate_mbit * 1000))
        return ["tbf", "rate", f"{rate_kbit}kbit", "burst", str(self.burst_bytes), "latency", f"{self.latency_ms:g}ms"]

    def min_seconds(self, nbytes: float) -> float:
        """The least time ``nbytes`` can take through the bucket (a full bucket leaves at once)."""
        return max(0.0, nbytes - self.burst_bytes) / self.bytes_per_s


@dataclass(frozen=True)
class Counters:
    """One veth end's kernel counters."""

    tx_bytes: int
    rx_bytes: int
    tx_packets: int
    rx_packets: int

    def __sub__(self, other: Counters) -> Counters:
        return Counters(
            self.tx_bytes - other.tx_bytes,
            self.rx_bytes - other.rx_bytes,
            self.tx_packets - other.tx_packets,
            self.rx_packets - other.rx_packets,
        )


def parse_link_stats(text: str) -> Counters:
    """``ip -j -s link show dev DEV`` → its counters."""
    try:
        stats = json.loads(text)[0]["stats64"]
        return Counters(stats["tx"]["bytes"], stats["rx"]["bytes"], stats["tx"]["packets"], stats["rx"]["packets"])
    except (ValueError, LookupError, TypeError) as exc:
        raise ValueError(f"unexpected `ip -j -s link` output ({exc}): {text[:200]!r}") from None


def names_for(pid: int, n: int) -> tuple[str, str, str, str]:
    """Namespace and veth names for pair ``n`` of process ``pid`` (interface names stay within 15 bytes)."""
    tag = f"{pid % 100_000}x{n % 1000}"
    return f"{PREFIX}{pid}-{n}-a", f"{PREFIX}{pid}-{n}-b", f"pfa{tag}", f"pfb{tag}"


def addresses_for(n: int) -> tuple[str, str]:
    """The two ends' addresses (a /30 of 10.213.0.0/16)."""
    third, fourth = divmod((n % 16_384) * 4, 256)
    return f"{SUBNET}.{third}.{fourth + 1}", f"{SUBNET}.{third}.{fourth + 2}"


def leftovers(listing: str, alive: Callable[[int], bool]) -> list[str]:
    """Namespaces in ``ip netns list`` output made by a process of ours that no longer runs."""
    out = []
    for line in listing.splitlines():
        name = line.split(" ", 1)[0].strip()
        m = _NAME.match(name)
        if m and not alive(int(m.group(1))):
            out.append(name)
    return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _run(argv: list[str], check: bool = True) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except FileNotFoundError:
        raise NetnsUnavailable(f"{argv[0]} is not installed") from None
    if check and done.returncode != 0:
        raise NetnsUnavailable(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()[:500]}")
    return done.stdout


def _kill_inside(name: str) -> None:
    """SIGKILL whatever still runs in namespace ``name`` (only ever one of ours)."""
    for pid in _run(["ip", "netns", "pids", name], check=False).split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _delete(name: str) -> None:
    _kill_inside(name)
    _run(["ip", "netns", "delete", name], check=False)


def clean_leftovers() -> list[str]:
    """Delete the namespaces of earlier runs whose process is gone; returns their names."""
    stale = leftovers(_run(["ip", "netns", "list"], check=False), _pid_alive)
    for name in stale:
        _delete(name)
    return stale


def _enter(name: str) -> None:
    """In a worker thread: move this thread (only) into namespace ``name``."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {name}")
    finally:
        os.close(fd)


_open: set[NetnsPair] = set()
_hooks_installed = False


def _close_all() -> None:
    for pair in list(_open):
        pair.close()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _close_all()
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    else:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


_previous_handlers: dict[int, Any] = {}


def _install_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(_close_all)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            _previous_handlers[sig] = signal.getsignal(sig)
            signal.signal(sig, _on_signal)


@dataclass(eq=False)
class NetnsPair:
    """Region A's and region B's namespaces, the shaped veth between them, and forwarders into them."""

    shape: LinkShape = field(default_factory=LinkShape)
    n: int = field(default_factory=lambda: next(_seq))
    created: bool = False
    _bridges: list[asyncio.AbstractServer] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _dialers: dict[str, ThreadPoolExecutor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ns_a, self.ns_b, self.dev_a, self.dev_b = names_for(os.getpid(), self.n)
        self.addr_a, self.addr_b = addresses_for(self.n)

    def ns(self, side: Side) -> str:
        return self.ns_a if side == "a" else self.ns_b

    def dev(self, side: Side) -> str:
        return self.dev_a if side == "a" else self.dev_b

    def addr(self, side: Side) -> str:
        return self.addr_a if side == "a" else self.addr_b

    # --- life cycle -------------------------------------------------------------------------------------
    def __enter__(self) -> NetnsPair:
        self.create()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create(self) -> None:
        """Make both namespaces, the veth pair, addresses, routes and the shaping (all or nothing)."""
        if os.geteuid() != 0:
            raise NetnsUnavailable("network namespaces need root (CAP_NET_ADMIN and CAP_SYS_ADMIN)")
        clean_leftovers()
        _install_hooks()
        _open.add(self)
        self.created = True
        try:
            for side in SIDES:
                _run(["ip", "netns", "add", self.ns(side)])
                _run(["ip", "-n", self.ns(side), "link", "set", "lo", "up"])
            _run(["ip", "-n", self.ns_a, "link", "add", self.dev_a, "type", "veth", "peer", "name", self.dev_b])
            _run(["ip", "-n", self.ns_a, "link", "set", self.dev_b, "netns", self.ns_b])
            for side in SIDES:
                ns, dev = self.ns(side), self.dev(side)
                _run(["ip", "-n", ns, "addr", "add", f"{self.addr(side)}/30", "dev", dev])
                _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", *self.shape.tbf_args()])
            self.restore()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the forwarders, end what still runs inside, delete both namespaces (idempotent)."""
        if self._loop is not None:
            loop, self._loop = self._loop, None

            async def shut() -> None:
                for server in self._bridges:
                    server.close()
                self._bridges.clear()

            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(shut(), loop).result(5)
            loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None:
                self._thread.join(5)
        for dialer in self._dialers.values():
            dialer.shutdown(wait=False, cancel_futures=True)
        self._dialers.clear()
        if self.created:
            for side in SIDES:
                _delete(self.ns(side))
            self.created = False
        _open.discard(self)

    # --- the link ---------------------------------------------------------------------------------------
    def exec_prefix(self, side: Side) -> list[str]:
        """Prepend to an argv to run it inside ``side``'s namespace."""
        return ["ip", "netns", "exec", self.ns(side)]

    def counters(self, side: Side) -> Counters:
        """``side``'s veth end's kernel counters (tx: bytes it sent towards the other side)."""
        return parse_link_stats(_run(["ip", "-n", self.ns(side), "-j", "-s", "link", "show", "dev", self.dev(side)]))

    def qdisc(self, side: Side) -> dict[str, Any]:
        """``side``'s root qdisc as ``tc -j -s`` shows it (kind, options, bytes, drops, overlimits)."""
        shown = json.loads(_run(["tc", "-n", self.ns(side), "-j", "-s", "qdisc", "show", "dev", self.dev(side)]))
        return dict(next(q for q in shown if q.get("root")))

    def cut(self) -> None:
        """Take both ends down (the link is cut: connects fail, packets in flight are lost)."""
        for side in SIDES:
            _run(["ip", "-n", self.ns(side), "link", "set", self.dev(side), "down"])

    def restore(self) -> None:
        """Bring both ends up again (addresses, routes and qdiscs are as before)."""
        for side in SIDES:
            _run(["ip", "-n", self.ns(side), "link", "set", self.dev(side), "up"])

    def is_up(self) -> bool:
        shown = json.loads(_run(["ip", "-n", self.ns_a, "-j", "link", "show", "dev", self.dev_a]))
        return "UP" in shown[0].get("flags", []) and "LOWER_UP" in shown[0].get("flags", [])

    # --- reaching listeners inside ----------------------------------------------------------------------
    def expose(self, side: Side, host: str, port: int) -> int:
        """A port on 127.0.0.1 (root namespace) forwarded to ``host:port`` inside ``side``'s namespace."""
        if not self.created:
            raise RuntimeError("the namespaces are not created")
        loop = self._bridge_loop()
        dialer = self._dialers.setdefault(
            side, ThreadPoolExecutor(4, f"netns-{side}", initializer=_enter, initargs=(self.ns(side),))
        )

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                sock = await loop.run_in_executor(dialer, _dial, host, port)
                up_reader, up_writer = await asyncio.open_connection(sock=sock)
            except OSError:
                writer.close()
                return
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))

        async def serve() -> int:
            server = await asyncio.start_server(handle, "127.0.0.1", 0)
            self._bridges.append(server)
            return int(server.sockets[0].getsockname()[1])

        return asyncio.run_coroutine_threadsafe(serve(), loop).result(10)

    def _bridge_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=_run_loop, args=(loop,), name="netns-bridge", daemon=True)
            self._loop = loop
            self._thread.start()
        return self._loop


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        with contextlib.suppress(Exception):
            loop.run_until_complete(asyncio.sleep(0))
        loop.close()


def _dial(host: str, port: int) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=10)
    sock.setblocking(False)
    return sock


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65_536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            writer.close()


def netns_available() -> str | None:
    """None when namespaces, veth and tbf work here; otherwise why not (tries a throwaway pair)."""
    try:
        with NetnsPair(LinkShape()) as pair:
            pair.counters("a")
    except (NetnsUnavailable, OSError) as exc:
        return str(exc)
    return None


def pairs_open() -> Iterator[NetnsPair]:
    """The pairs this process holds now (for checks)."""
    return iter(list(_open))
