"""The port picker of every local stack: outside the ephemeral range, never twice, never a taken port."""

from __future__ import annotations

import random
import socket
import tempfile
from pathlib import Path

import pytest

from prfaas_local import ports


def test_ports_come_from_below_the_ephemeral_range_and_never_twice() -> None:
    picked = [ports.free_port() for _ in range(200)]
    assert len(set(picked)) == len(picked)
    assert all(ports.LOWEST <= p < ports._ephemeral_low() for p in picked)


class _Scripted(random.Random):
    """Draws the given ports in order (the picker's only source of randomness)."""

    def __init__(self, draws: list[int]) -> None:
        super().__init__()
        self.draws = draws

    def randrange(self, *_args: object, **_kwargs: object) -> int:  # type: ignore[override]
        return self.draws.pop(0)


def _claim(port: int) -> Path:
    return Path(tempfile.gettempdir()) / "prfaas-ports" / str(port)


def _unused_low_port(start: int) -> int:
    for port in range(start, start + 2_000):
        if ports._bindable(port, "127.0.0.1") and not _claim(port).exists():
            return port
    raise AssertionError("no unused port to test with")


def test_a_bound_port_and_a_port_reserved_by_another_process_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        taken = listener.getsockname()[1]
        reserved = _unused_low_port(ports.LOWEST + 7_000)
        claim = _claim(reserved)
        claim.parent.mkdir(exist_ok=True)
        claim.touch()  # another process's fresh claim
        free = _unused_low_port(reserved + 1)
        try:
            monkeypatch.setattr(ports.random, "Random", lambda: _Scripted([taken, reserved, free]))
            assert ports.free_port() == free
        finally:
            claim.unlink(missing_ok=True)
