"""Fair sharing of one link's capacity among concurrent transfers: a pure scheduler of transmission grants.

The link is a single server of bytes at ``rate`` bytes per second. Each flow asks for one chunk at a time;
:meth:`FairShare.next_grant` serves the flows that are waiting round-robin (one chunk each per round, so
equal chunks give equal shares — processor sharing at chunk granularity), and times each grant back to back:
a chunk of ``n`` bytes granted at ``now`` finishes serialisation at ``max(now, busy_until) + n/rate``.
Hence a transfer of ``B`` bytes can never finish earlier than ``B/rate`` after it started, whatever else the
link carries. A rate of 0 (the link cut) grants nothing until the rate is raised; a rate change applies to
every grant after it.

No clock and no I/O here: the asyncio relay (:mod:`.relay`) passes ``now`` in and sleeps.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class Grant:
    flow: int
    nbytes: int
    start: float
    finish: float


class FairShare:
    """Round-robin grants of the link's serialisation time."""

    def __init__(self, rate_bytes_per_s: float) -> None:
        if rate_bytes_per_s < 0:
            raise ValueError("rate must be >= 0")
        self.rate = rate_bytes_per_s
        self.busy_until = 0.0
        self._pending: OrderedDict[int, int] = OrderedDict()

    def set_rate(self, rate_bytes_per_s: float) -> None:
        if rate_bytes_per_s < 0:
            raise ValueError("rate must be >= 0")
        self.rate = rate_bytes_per_s

    def request(self, flow: int, nbytes: int) -> None:
        """Flow ``flow`` wants to send ``nbytes`` (one outstanding request per flow)."""
        if nbytes <= 0:
            raise ValueError("nbytes must be > 0")
        if flow in self._pending:
            raise ValueError(f"flow {flow} already has a pending request")
        self._pending[flow] = nbytes

    def cancel(self, flow: int) -> None:
        self._pending.pop(flow, None)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def next_grant(self, now: float) -> Grant | None:
        """The next flow's chunk (round-robin: the flow served goes to the back), or None."""
        if not self._pending or self.rate <= 0:
            return None
        flow, nbytes = self._pending.popitem(last=False)
        start = max(now, self.busy_until)
        self.busy_until = start + nbytes / self.rate
        return Grant(flow, nbytes, start, self.busy_until)

    def backlog_s(self, now: float) -> float:
        """Seconds of serialisation already granted ahead of ``now``."""
        return max(0.0, self.busy_until - now)
