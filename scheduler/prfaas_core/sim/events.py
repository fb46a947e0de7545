"""The event heap: a virtual clock and a priority queue of callbacks (hand-written ``heapq``, no simpy).

Contract: events run in time order; ties run in the order they were scheduled (a sequence number breaks
them), so a run is a deterministic function of its inputs. Cancellation is lazy: the owner of an event
keeps a generation number or a flag and ignores stale callbacks (cheaper than removing heap entries).

A batch known up front (a run's arrivals: :meth:`EventQueue.at_all`) is kept as a sorted list beside the heap
and merged with it by ``(time, seq)``, the heap's own order, so the order is the same as if each had gone
through :meth:`EventQueue.at`; the heap then holds only the events the run makes (tens, not ten thousand), and
each push and pop is that much cheaper.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Any

Callback = Callable[[Any], None]
Event = tuple[float, int, Callback, Any]


class EventQueue:
    """Virtual time plus a heap of ``(time_s, seq, callback, arg)`` (and a sorted batch beside it)."""

    __slots__ = ("_batch", "_heap", "_seq", "events_run", "now_s")

    def __init__(self) -> None:
        self._heap: list[Event] = []
        self._batch: list[Event] = []
        """Latest first: the next one is the last (each is popped as it runs, so nothing run stays referenced)."""
        self._seq = 0
        self.now_s = 0.0
        self.events_run = 0

    def at(self, time_s: float, callback: Callback, arg: Any = None) -> None:
        """Run ``callback(arg)`` at ``time_s`` (never before now: a past time runs at once, in order)."""
        seq = self._seq = self._seq + 1
        now = self.now_s
        heapq.heappush(self._heap, (time_s if time_s > now else now, seq, callback, arg))

    def at_all(self, events: Iterable[tuple[float, Callback, Any]]) -> None:
        """:meth:`at` for each ``(time_s, callback, arg)`` in turn (the same order), kept beside the heap."""
        now, seq = self.now_s, self._seq
        batch = list(self._batch)
        for time_s, callback, arg in events:
            seq += 1
            batch.append((time_s if time_s > now else now, seq, callback, arg))
        self._seq = seq
        batch.sort(reverse=True)  # by (time, seq), latest first: seq is unique, so callbacks are never compared
        self._batch = batch

    def clear(self) -> None:
        """Drop every pending event (a run that has decided its outcome)."""
        self._heap.clear()
        self._batch.clear()

    def __len__(self) -> int:
        return len(self._heap) + len(self._batch)

    def run_until(self, end_s: float) -> None:
        """Run every event with ``time <= end_s``; the clock then stands at ``end_s``."""
        heap, batch = self._heap, self._batch
        pop = heapq.heappop
        n = 0
        while True:
            if batch:  # a callback may clear it (in place) or add a batch (a new list: re-read below)
                event = batch[-1]
                if heap and heap[0] < event:
                    event = heap[0]
                    if event[0] > end_s:
                        break
                    pop(heap)
                else:
                    if event[0] > end_s:
                        break
                    batch.pop()
            elif heap and heap[0][0] <= end_s:
                event = pop(heap)
            else:
                break
            self.now_s = event[0]
            event[2](event[3])
            n += 1
            if self._batch is not batch:
                batch = self._batch
        self.events_run += n
        self.now_s = max(self.now_s, end_s)
