"""Ports for the processes a local stack starts, chosen so that nothing else takes them before they bind.

Asking the OS for port 0 and closing the socket hands back a port from the *ephemeral* range — the range the
kernel also gives every outgoing connection. Between the pick and the server's bind (seconds, for a stack
that starts a dozen processes first) a client socket can take it: "address already in use". So a port is
drawn at random from below the ephemeral range, where no connection's source port lands, checked free by a
bind, and reserved across processes with an exclusive file under the temp directory (a reservation older
than ``RESERVATION_S`` is stale: its owner has bound the port or died). Within one process a port is never
handed out twice.
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
import time
from pathlib import Path

LOWEST = 10_000
"""The bottom of the range drawn from (above the well-known and most registered service ports)."""
RESERVATION_S = 300.0
"""How long a reservation keeps other processes off a port that is not yet bound."""
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 where /proc is not there to say)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _bindable(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _reserve(port: int) -> bool:
    """Claim ``port`` for this process unless another holds a fresh claim on it."""
    folder = Path(tempfile.gettempdir()) / "prfaas-ports"
    folder.mkdir(exist_ok=True)
    claim = folder / str(port)
    try:
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        return True
    except FileExistsError:
        try:
            if time.time() - claim.stat().st_mtime < RESERVATION_S:
                return False
            claim.touch()  # stale: its owner bound the port long ago or died
            return True
        except OSError:
            return False


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that is free now, outside the ephemeral range, and reserved for the caller."""
    top = _ephemeral_low()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(LOWEST, top)
        if port in _handed_out or not _bindable(port, host) or not _reserve(port):
            continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port on {host} in {LOWEST}..{top - 1} after 200 tries")
