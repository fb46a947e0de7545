"""The inter-datacenter link as a fluid model: capacity, one-way delay, max-min fair sharing between the
concurrent KV streams, and layer-wise pipelining of each stream with the prefill that produces it.

Model (paper §3.3, paper-spec §2.3):

* A stream of ``S`` bytes belongs to a prefill running over ``[t0, t1]``. Its KV is produced layer by
  layer, uniformly in time, so by ``t`` the bytes ``S·(t − t0)/(t1 − t0)`` exist; the stream can never
  have sent more than that (**pipelining**: a transfer cannot finish before its prefill ends). A cache
  move (``t0 = t1``) has all its bytes at once.
* The link shares its capacity ``C`` **max-min fairly** (processor sharing with rate caps): a stream that
  has caught up with its prefill is capped at its production rate ``S/(t1 − t0)``; every other stream may
  take any rate; water-filling gives each the smaller of its cap and an equal share of what is left. The
  sum of the rates never exceeds ``C`` — the link never carries more than its capacity.
* The last byte arrives one-way delay (``RTT/2``) after it was sent.
* ``set_capacity`` changes ``C`` live (a cut); the streams in flight simply slow down — nothing is dropped.

Rates are piecewise constant between *link events* (a stream starts, catches up with its prefill, ends,
or the capacity changes); the link keeps one pending wake-up on the event heap (stale ones are ignored by
generation). Byte counters are exact integrals of the rates, so 1-s egress windows are exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from operator import itemgetter
from typing import Any

from .events import EventQueue

_EPS_BYTES = 1.0


class Stream:
    """One transfer on the link."""

    __slots__ = ("done", "key", "pace", "prod_end_s", "prod_rate", "prod_start_s", "rate", "sent", "size")

    def __init__(
        self,
        key: Any,
        size: float,
        prod_start_s: float,
        prod_end_s: float,
        done: Callable[[Any], None],
        pace: float = math.inf,
    ) -> None:
        self.pace = pace
        """The rate the sender paces this stream at (a booked link window's rate), bytes/s."""
        self.key = key
        self.size = size
        self.sent = 0.0
        self.prod_start_s = prod_start_s
        self.prod_end_s = prod_end_s
        span = prod_end_s - prod_start_s
        self.prod_rate = size / span if span > 0 else math.inf
        self.rate = 0.0
        self.done = done

    def produced(self, now_s: float) -> float:
        if now_s >= self.prod_end_s:
            return self.size
        return self.prod_rate * (now_s - self.prod_start_s)


class FluidLink:
    """A link of ``capacity_bytes_per_s`` shared by :class:`Stream` s (see the module docstring)."""

    def __init__(self, events: EventQueue, capacity_bytes_per_s: float, one_way_delay_s: float = 0.0) -> None:
        if capacity_bytes_per_s <= 0:
            raise ValueError("capacity must be positive")
        self._events = events
        self.capacity = capacity_bytes_per_s
        self.one_way_delay_s = one_way_delay_s
        self._streams: dict[Any, Stream] = {}
        self._last_s = 0.0
        self._sent_before = 0.0
        """Bytes sent up to ``_last_s``."""
        self._agg_rate = 0.0
        self._gen = 0
        self.max_rate_seen = 0.0
        """Largest aggregate rate ever allocated (bytes/s), for the never-over-capacity check."""
        self.max_over_capacity = 0.0
        """Largest ``aggregate rate − capacity`` ever allocated (≤ 0 unless the model is broken)."""

    # --- queries ---------------------------------------------------------------------------------------

    @property
    def active(self) -> int:
        return len(self._streams)

    @property
    def aggregate_rate(self) -> float:
        return self._agg_rate

    def bytes_sent(self, now_s: float) -> float:
        """Cumulative bytes put on the wire up to ``now_s`` (exact; rates are constant since the last event)."""
        return self._sent_before + self._agg_rate * (now_s - self._last_s)

    def stream_rates(self) -> dict[Any, float]:
        return {k: s.rate for k, s in self._streams.items()}

    # --- changes -----------------------------------------------------------------------------------------

    def start(
        self,
        key: Any,
        size_bytes: float,
        prod_start_s: float,
        prod_end_s: float,
        done: Callable[[Any], None],
        pace: float = math.inf,
    ) -> None:
        """Add a stream whose bytes are produced over ``[prod_start_s, prod_end_s]``; ``done(key)`` runs when
        its last byte has arrived (send completion + one-way delay). ``pace``: the sender never sends it
        faster (bytes/s; a booked window's rate)."""
        now = self._events.now_s
        self._advance(now)
        if size_bytes <= _EPS_BYTES:
            self._events.at(max(now, prod_end_s) + self.one_way_delay_s, done, key)
            return
        self._streams[key] = Stream(key, size_bytes, prod_start_s, prod_end_s, done, pace)
        self._reallocate(now)

    def set_capacity(self, capacity_bytes_per_s: float) -> None:
        if capacity_bytes_per_s <= 0:
            raise ValueError("capacity must be positive")
        now = self._events.now_s
        self._advance(now)
        self.capacity = capacity_bytes_per_s
        self._reallocate(now)

    # --- internals ----------------------------------------------------------------------------------------

    def _advance(self, now_s: float) -> None:
        dt = now_s - self._last_s
        if dt > 0:
            for s in self._streams.values():
                if s.rate:
                    sent = s.sent + s.rate * dt
                    cap = s.produced(now_s)
                    s.sent = sent if sent < cap else cap
            self._sent_before += self._agg_rate * dt
            self._last_s = now_s

    def _reallocate(self, now_s: float) -> None:
        """Finish streams that are done, water-fill the capacity, schedule the next link event."""
        streams = self._streams
        finished = [s for s in streams.values() if s.sent >= s.size - _EPS_BYTES and now_s >= s.prod_end_s - 1e-12]
        for s in finished:
            del streams[s.key]
            self._events.at(now_s + self.one_way_delay_s, s.done, s.key)
        self._gen += 1
        if not streams:
            self._agg_rate = 0.0
            return
        # caps: a stream caught up with a still-running prefill is limited to its production rate
        capped: list[tuple[float, Stream]] = []
        free: list[Stream] = []
        for s in streams.values():
            if now_s < s.prod_end_s and s.sent >= s.produced(now_s) - _EPS_BYTES:
                capped.append((min(s.prod_rate, s.pace), s))
            elif s.pace < math.inf:
                capped.append((s.pace, s))
            else:
                free.append(s)
        capped.sort(key=itemgetter(0))
        left = self.capacity
        n_left = len(capped) + len(free)
        for i, (cap, s) in enumerate(capped):
            share = left / n_left
            if cap <= share:
                s.rate = cap
                left -= cap
                n_left -= 1
            else:
                for _, rest in capped[i:]:
                    free.append(rest)
                break
        if free:
            share = left / len(free)
            for s in free:
                s.rate = share
        total = sum([s.rate for s in streams.values()])  # (a list: summed faster, in the same order)
        self._agg_rate = total
        self.max_rate_seen = max(self.max_rate_seen, total)
        self.max_over_capacity = max(self.max_over_capacity, total - self.capacity)
        # next event: a stream finishes, or a backlogged stream catches up with its prefill
        nxt = math.inf
        for s in streams.values():
            rate = s.rate
            if rate <= 0:
                continue
            t_end = now_s + (s.size - s.sent) / rate
            if t_end < s.prod_end_s:
                t_end = s.prod_end_s
            if now_s < s.prod_end_s and rate > s.prod_rate:
                backlog = s.produced(now_s) - s.sent
                t_catch = now_s + backlog / (rate - s.prod_rate)
                if t_catch < t_end:
                    t_end = t_catch
            if t_end < nxt:
                nxt = t_end
        if nxt < math.inf:
            self._events.at(nxt, self._wake, self._gen)

    def _wake(self, gen: int) -> None:
        if gen != self._gen:
            return
        now = self._events.now_s
        self._advance(now)
        self._reallocate(now)
