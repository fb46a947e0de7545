"""The event heap: a virtual clock and a priority queue of callbacks (hand-written ``heapq``, no simpy).

Contract: events run in time order; ties run in the order they were scheduled (a sequence number breaks
them), so a run is a deterministic function of its inputs. Cancellation is lazy: the owner of an event
keeps a generation number or a flag and ignores stale callbacks (cheaper than removing heap entries).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

Callback = Callable[[Any], None]


class EventQueue:
    """Virtual time plus a heap of ``(time_s, seq, callback, arg)``."""

    __slots__ = ("_heap", "_seq", "events_run", "now_s")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callback, Any]] = []
        self._seq = 0
        self.now_s = 0.0
        self.events_run = 0

    def at(self, time_s: float, callback: Callback, arg: Any = None) -> None:
        """Run ``callback(arg)`` at ``time_s`` (never before now: a past time runs at once, in order)."""
        self._seq += 1
        heapq.heappush(self._heap, (time_s if time_s > self.now_s else self.now_s, self._seq, callback, arg))

    def clear(self) -> None:
        """Drop every pending event (a run that has decided its outcome)."""
        self._heap.clear()

    def __len__(self) -> int:
        return len(self._heap)

    def run_until(self, end_s: float) -> None:
        """Run every event with ``time <= end_s``; the clock then stands at ``end_s``."""
        heap = self._heap
        pop = heapq.heappop
        n = 0
        while heap and heap[0][0] <= end_s:
            time_s, _, callback, arg = pop(heap)
            self.now_s = time_s
            callback(arg)
            n += 1
        self.events_run += n
        self.now_s = max(self.now_s, end_s)
