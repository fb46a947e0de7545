"""Available bandwidth, measured: what the link delivers *now*, which bounds the configured capacity.

A real inter-DC link shares its capacity with other traffic, and an operator can squeeze it: the configured
capacity is an upper bound. :class:`LinkEstimator` turns what the KV streams achieved into a bound:

* **Samples**: each finished KV stream's bytes and its transfer time (:meth:`LinkEstimator.stream`, from the
  puller's own timing: the router times the decode leg's pull, the simulator its fluid link). A stream is
  *expected* to take its bytes at the best per-stream rate of the last ``history_s`` (or at the bound in force,
  when lower: streams on time at the bound do not lower it further), never less than its own floor (a layer-wise
  stream's production, a paced one's pace). The link's measured egress counts too when a reading exists.
* **Squeezed** when the recent streams ran late (byte-weighted, slower than ``slowdown`` of the expected rate,
  and by ``min_excess_s`` a stream on average: a pull's fixed overhead is not the link's doing) while the busy
  link delivered less than ``slowdown`` of the capacity in force (more is a loaded link, not a squeezed one; a
  loss smaller than that is not seen). The bound is then what the link delivered: the larger of the streams'
  *busy-period rate* (their bytes over the union of their transfer intervals) and the measured egress (which
  also counts other routers' streams). A pull in flight ``stall_s`` past twice its expected time (*overdue*)
  bounds it too: the pulls in flight have moved at most their bytes in the oldest one's age. Source ``streams``.
* **Stalled** (a cut): a pull overdue with no stream finished for ``stall_s`` and (when a measurement exists)
  nothing delivered: the bound is 0 until a stream finishes. Source ``stalled``. A cut is thus seen within
  ``stall_s`` plus twice the pull's expected time, not after the KV-pull timeout.
* Otherwise the bound **probes** back up by ``probe_per_s`` a second (from at least ``probe_floor`` of the
  capacity) until it reaches the configured capacity, where it lifts (source ``configured``): a restored link is
  found again, since a squeezed bound admits less and would otherwise never see more.

:meth:`Available.bound` applies a bound to :class:`~.link_state.LinkParams` (the capacity; the cap, the watermarks and
``t_bw`` follow), which the router's link states, the gateway's calendar and the simulator all use. Pure: time
and bytes are parameters; times are on the caller's clock, rates in model Gbps (``time_scale``: the router
passes its refresher's wall clock, whose window, stall and probe rate are about the control loop).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from ..names import GBPS_BITS
from .frozen import once, quick_init
from .link_state import LinkParams

EstimateSource = Literal["configured", "streams", "stalled"]
ESTIMATE_SOURCES: tuple[EstimateSource, ...] = ("configured", "streams", "stalled")
MIN_CAPACITY_GBPS = 1e-6
"""A stalled link's capacity in :class:`~.link_state.LinkParams` (which must stay positive): nothing fits under it."""


@dataclass(frozen=True)
class EstimateParams:
    window_s: float = 5.0
    """Streams that finished this recently are the evidence."""
    slowdown: float = 0.5
    """Streams that achieved less than this fraction of their expected rate were held back by the link."""
    min_excess_s: float = 0.25
    """...and by at least this much each on average (a pull's fixed overhead, its decode's queue and the timer's
    noise are not the link's doing)."""
    stall_s: float = 3.0
    """A pull this much past its expected end is overdue (with nothing finished meanwhile: stalled)."""
    probe_per_s: float = 0.2
    """Unbounded evidence: the bound rises by this fraction a second."""
    probe_floor: float = 0.05
    """Probing starts from at least this fraction of the configured capacity (after a cut)."""
    history_s: float = 120.0
    """The best per-stream rate of this long is a stream's expected rate when it brings none."""

    def __post_init__(self) -> None:
        if not 0 < self.slowdown < 1:
            raise ValueError("slowdown must be in (0, 1)")
        if self.window_s <= 0 or self.stall_s <= 0 or self.history_s <= 0 or self.min_excess_s < 0:
            raise ValueError("window_s, stall_s and history_s must be positive")
        if self.probe_per_s <= 0 or not 0 < self.probe_floor <= 1:
            raise ValueError("probe_per_s must be positive and probe_floor in (0, 1]")


@quick_init
@dataclass(frozen=True)
class StreamSample:
    start_s: float
    end_s: float
    bytes: float
    expected_s: float | None = None
    """The least time it could take whatever the link (its production or pacing; None: no floor). Beyond it a
    stream is expected to run at the best per-stream rate seen, or the bound in force when that is lower."""

    @once
    def seconds(self) -> float:
        return max(self.end_s - self.start_s, 1e-9)

    @once
    def gbits(self) -> float:
        """Its bytes in gigabits (the estimate reads them every second the sample is in its window)."""
        return self.bytes * 8.0 / GBPS_BITS

    @property
    def gbps(self) -> float:
        return self.bytes * 8.0 / self.seconds / GBPS_BITS


@quick_init
@dataclass(frozen=True)
class Pull:
    """A KV stream in flight: when it started, its bytes and the least time it takes (its production, when it
    streams layer-wise with its prefill)."""

    start_s: float
    bytes: float
    least_s: float = 0.0


@dataclass(frozen=True)
class Available:
    """The estimate: ``gbps`` None means no bound (the configured capacity stands)."""

    gbps: float | None = None
    source: EstimateSource = "configured"
    reason: str = "no evidence the link delivers less than configured"

    def bound(self, params: LinkParams) -> LinkParams:
        """``params`` with its capacity bounded by this estimate (the cap and watermarks follow)."""
        if self.gbps is None or self.gbps >= params.capacity_gbps:
            return params
        return replace(params, capacity_gbps=max(self.gbps, MIN_CAPACITY_GBPS))

    def capacity_gbps(self, params: LinkParams) -> float:
        return self.bound(params).capacity_gbps


_CONFIGURED = Available()


def busy_gbps(samples: Sequence[StreamSample]) -> float:
    """The samples' bytes over the union of their transfer intervals (what the link carried while busy)."""
    spans = sorted((s.start_s, s.end_s) for s in samples)
    busy, cur_a, cur_b = 0.0, None, 0.0
    for a, b in spans:
        if cur_a is None or a > cur_b:
            if cur_a is not None:
                busy += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_a is not None:
        busy += cur_b - cur_a
    return sum(s.bytes for s in samples) * 8.0 / max(busy, 1e-9) / GBPS_BITS


class LinkEstimator:
    """One link's available-bandwidth estimate (a small state machine; see the module docstring)."""

    def __init__(self, params: EstimateParams | None = None, time_scale: float = 1.0) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.params = params or EstimateParams()
        self.time_scale = time_scale
        """Model seconds per second of the clock the caller passes (rates in and out are model Gbps)."""
        self._samples: deque[StreamSample] = deque()
        self._best: deque[tuple[float, float]] = deque()  # (end_s, gbps), decreasing gbps
        self._bound: float | None = None
        self._last_s: float | None = None
        self.current = Available()

    def stream(self, sample: StreamSample) -> None:
        """A KV stream finished: its bytes over its transfer time."""
        if sample.bytes <= 0 or sample.end_s < sample.start_s:
            return
        self._samples.append(sample)
        g = sample.gbps / self.time_scale
        while self._best and self._best[-1][1] <= g:
            self._best.pop()
        self._best.append((sample.end_s, g))

    def best_stream_gbps(self, now_s: float) -> float | None:
        """The fastest stream of the last ``history_s`` (an uncontended stream's rate)."""
        horizon = now_s - self.params.history_s
        while self._best and self._best[0][0] < horizon:
            self._best.popleft()
        return self._best[0][1] if self._best else None

    def update(
        self,
        now_s: float,
        capacity_gbps: float,
        pulls: Sequence[Pull] = (),
        measured_gbps: float | None = None,
    ) -> Available:
        """The estimate at ``now_s`` (call about once a second), given the pulls in flight and the link's
        measured egress since the last call (None: not measured)."""
        p = self.params
        dt = 0.0 if self._last_s is None else max(0.0, now_s - self._last_s)
        self._last_s = now_s
        samples = self._samples
        while samples and samples[0].end_s < now_s - p.window_s:
            samples.popleft()
        best = self.best_stream_gbps(now_s)
        rate_now = self._bound if self._bound is not None else capacity_gbps
        in_flight = sum([x.bytes for x in pulls]) * 8.0 / GBPS_BITS  # (lists: summed faster than generators)
        ts = self.time_scale
        expected_s = in_flight / max(rate_now, MIN_CAPACITY_GBPS) / ts
        overdue = any(now_s - x.start_s > 2.0 * max(expected_s, x.least_s) + p.stall_s for x in pulls)
        # (``oldest`` and ``finished_lately`` are read only for an overdue pull: computed then, once a second being
        # the common case without one)
        oldest = max((now_s - x.start_s for x in pulls), default=0.0) if overdue else 0.0
        finished_lately = overdue and any(s.end_s >= now_s - p.stall_s for s in samples)
        delivered_nothing = measured_gbps is None or measured_gbps <= 0.01 * capacity_gbps
        if overdue and not finished_lately and delivered_nothing:
            self._bound = 0.0
            why = f"a KV pull in flight for {oldest:.1f} s (expected {expected_s:.1f} s) and nothing delivered"
            self.current = Available(0.0, "stalled", f"link stalled: {why}")
            return self.current
        slowed = False
        recent = list(samples)
        if recent:
            # a stream's expected time: its own floor (production, pacing), or its bytes at the best per-stream
            # rate seen, bounded by the bound in force (streams at the bound are on time: no ratchet down)
            rate = min(best or math.inf, rate_now)
            expected = sum([max(s.expected_s or 0.0, s.gbits / rate / ts) for s in recent])
            actual = sum([s.seconds for s in recent])
            slowed = expected < p.slowdown * actual and actual - expected > p.min_excess_s * len(recent)
        if slowed or overdue:
            # overdue: the pulls in flight have moved at most their bytes in the oldest one's age
            seen = (in_flight / max(oldest, 1e-9) if overdue else busy_gbps(recent)) / ts
            delivered = max(seen, measured_gbps or 0.0)
            # a busy link that still delivered most of the capacity in force is loaded, not squeezed
            if 0 < delivered < p.slowdown * rate_now or (overdue and delivered > 0):
                self._bound = min(delivered, capacity_gbps)
                why = "a KV pull is overdue" if overdue else "recent KV streams ran slower than expected"
                self.current = Available(
                    self._bound, "streams", f"{why}: the link delivered {delivered:.3g} Gbps while busy"
                )
                return self.current
        if self._bound is None:
            self.current = _CONFIGURED  # (unbounded: one value, not a new one every second)
            return self.current
        grown = max(self._bound, p.probe_floor * capacity_gbps) * (1.0 + p.probe_per_s) ** dt
        if grown >= capacity_gbps:
            self._bound = None
            self.current = Available(None, "configured", "probed back up to the configured capacity")
            return self.current
        self._bound = grown
        self.current = Available(grown, "streams", f"streams on time: probing up, {grown:.3g} Gbps")
        return self.current
