"""Link state: egress estimate, scarce/abundant with hysteresis, and admission under the cap.

Thresholds (ARCHITECTURE.md): the cap ``capacity x maxUtilization`` is a ceiling enforced by admission — a
remote prefill is admitted only while projected egress stays under it. The *scarce* state starts at
``scarceWatermark x cap`` and ends only below ``abundantWatermark x cap`` (hysteresis), so ``t`` rises
before the cap is reached.

Many routers share one link, so a replica's estimate is the link's *measured* total (read about once a
second, so slightly stale) corrected by this replica's own change in in-flight egress since that
measurement; with no fresh measurement it falls back to its own in-flight egress. Admission looks ahead:
a remote prefill dispatched now streams only once a PrFaaS instance takes it, so the ledger schedules its own
streams on the PrFaaS instances ("lanes") and admits a new one against the egress expected during its window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from ..names import GBPS_BITS
from .frozen import once, quick_init
from .reasons import Why, text

LinkMode = Literal["abundant", "scarce"]


@dataclass(frozen=True)
class LinkParams:
    """A link's static parameters (from an InterDCLink or a RouterLink)."""

    name: str
    capacity_gbps: float
    max_utilization: float = 0.8
    scarce_watermark: float = 0.9
    abundant_watermark: float = 0.7
    measurement_max_age_s: float = 5.0
    """A measurement older than this is ignored (the estimate falls back to own in-flight egress)."""

    def __post_init__(self) -> None:
        if self.capacity_gbps <= 0:
            raise ValueError("capacity_gbps must be positive")
        if not 0 < self.abundant_watermark < self.scarce_watermark <= 1:
            raise ValueError("need 0 < abundant_watermark < scarce_watermark <= 1")
        if not 0 < self.max_utilization <= 1:
            raise ValueError("max_utilization must be in (0, 1]")

    @property
    def cap_gbps(self) -> float:
        """The ceiling admission enforces."""
        return self.capacity_gbps * self.max_utilization

    @property
    def scarce_gbps(self) -> float:
        return self.cap_gbps * self.scarce_watermark

    @property
    def abundant_gbps(self) -> float:
        return self.cap_gbps * self.abundant_watermark


@quick_init
@dataclass(frozen=True)
class LinkState:
    """Where the link stands now, and why."""

    mode: LinkMode = "abundant"
    egress_gbps: float = 0.0
    changed_at_s: float = 0.0
    reason: str = "no traffic observed yet"

    @property
    def scarce(self) -> bool:
        return self.mode == "scarce"


NO_TRAFFIC = LinkState()
"""A link's state before any (shared: a frozen value)."""


def next_link_state(prev: LinkState, egress_gbps: float, params: LinkParams, now_s: float) -> LinkState:
    """Hysteresis: abundant -> scarce at ``>= scarce_gbps``; scarce -> abundant only at ``< abundant_gbps``."""
    if prev.mode == "abundant" and egress_gbps >= params.scarce_gbps:
        reason = (
            f"egress {egress_gbps:.2f} Gbps >= scarce watermark {params.scarce_gbps:.2f} Gbps "
            f"({params.scarce_watermark:.0%} of the {params.cap_gbps:.2f} Gbps cap)"
        )
        return LinkState("scarce", egress_gbps, now_s, reason)
    if prev.mode == "scarce" and egress_gbps < params.abundant_gbps:
        reason = (
            f"egress {egress_gbps:.2f} Gbps < abundant watermark {params.abundant_gbps:.2f} Gbps "
            f"({params.abundant_watermark:.0%} of the cap)"
        )
        return LinkState("abundant", egress_gbps, now_s, reason)
    return LinkState(prev.mode, egress_gbps, prev.changed_at_s, prev.reason)  # (replace() is slow once a second)


@quick_init
@dataclass(frozen=True)
class Transfer:
    """One KV stream this replica dispatched: ``bytes`` over ``[start_s, start_s + duration_s]``.

    ``start_s`` is when it is expected to *stream*: its dispatch time plus its expected wait in the PrFaaS
    queue (see :class:`EgressLedger`'s lanes); ``lane`` is the PrFaaS instance slot it was scheduled on
    (-1 when the ledger does not model the queue).
    """

    bytes: float
    start_s: float
    duration_s: float
    lane: int = -1
    stream_offset_s: float = 0.0
    """The stream starts this long after ``start_s`` (pull-after-prefill: the prefill's duration; layer-wise: 0)."""
    stream_duration_s: float | None = None
    """How long the stream lasts (None: ``duration_s``, layer-wise at the prefill's production rate)."""

    # derived once per transfer (a frozen value): the calendar and the ledger read them for every booked stream
    # on every request, so each is computed on first use and then read from the instance (:func:`~.frozen.once`)

    @once
    def end_s(self) -> float:
        """When the lane (the PrFaaS instance) frees up."""
        return self.start_s + self.duration_s

    @once
    def stream_start_s(self) -> float:
        return self.start_s + self.stream_offset_s

    @once
    def stream_end_s(self) -> float:
        span = self.duration_s if self.stream_duration_s is None else self.stream_duration_s
        return self.stream_start_s + span

    @once
    def rate_gbps(self) -> float:
        span = self.duration_s if self.stream_duration_s is None else self.stream_duration_s
        return self.bytes * 8.0 / max(span, 1e-9) / GBPS_BITS

    @once
    def span(self) -> tuple[float, float, float]:
        """``(stream_start_s, stream_end_s, rate_gbps)``: the stream as the calendar's peak sums read it."""
        return self.stream_start_s, self.stream_end_s, self.rate_gbps


@dataclass
class EgressLedger:
    """This replica's in-flight KV streams on one link (a small state machine; time is a parameter).

    ``start`` when a remote prefill is dispatched (its KV streams during its prefill, layer-wise), ``finish``
    when it completes or fails; a transfer past its expected end counts until ``finish`` or ``expire_s``.

    **Lanes.** A long remote prefill first waits in the PrFaaS queue, and its KV crosses the link only while
    it is prefilled. With ``lanes`` = the number of ready PrFaaS instances (from the gateway's status), each
    dispatched transfer is scheduled on the lane (instance) that frees first, so a queued transfer counts from
    its expected streaming start instead of from dispatch; admission then checks the egress *during the new
    stream's window* (:meth:`admission_gbps`). With ``lanes = 0`` (unknown), every transfer counts from
    dispatch: always safe, but a long PrFaaS queue makes the link look busier than the wire is.
    """

    expire_s: float = 120.0
    lanes: int = 0
    _active: dict[str, Transfer] = field(default_factory=dict)
    _measured_gbps: float | None = None
    _measured_at_s: float = 0.0
    _own_at_measurement_gbps: float = 0.0
    _oldest_start_s: float = field(default=math.inf, repr=False, compare=False)
    """At most the earliest ``start_s`` booked (may lag low after a finish): nothing younger can expire."""
    _ends: tuple[float, int, int, list[float]] = field(default=(math.nan, 0, 0, []), repr=False, compare=False)
    """The last :meth:`_lane_ends` (its time, lanes and :attr:`_changes` then): a request reads them twice
    (its queue wait, its admission) and the calendar once more."""
    _changes: int = field(default=0, repr=False, compare=False)
    """Bumped by every change of the booked streams."""

    def set_lanes(self, lanes: int) -> None:
        """The number of PrFaaS instances that prefill in parallel (0: unknown, count from dispatch)."""
        self.lanes = max(0, lanes)

    def _lane_ends(self, now_s: float) -> list[float]:
        """When each lane frees up: the end of its last scheduled stream, never before ``now_s`` (read only)."""
        lanes = self.lanes
        at, at_lanes, changes, ends = self._ends
        if at == now_s and at_lanes == lanes and changes == self._changes:
            return ends
        ends = [now_s] * lanes
        for t in self._active.values():
            lane = t.lane
            if 0 <= lane < lanes and t.end_s > ends[lane]:
                ends[lane] = t.end_s
        self._ends = (now_s, lanes, self._changes, ends)
        return ends

    def start(
        self,
        key: str,
        bytes_: float,
        now_s: float,
        duration_s: float,
        queued: bool = True,
        max_gbps: float | None = None,
    ) -> Transfer:
        """Record a dispatched stream; returns it with its expected streaming window. ``queued=False``: it
        needs no PrFaaS instance (a cache move) and streams from now. ``max_gbps`` (the link's cap): a stream
        faster than it is booked at it, for longer (:func:`~.routing.stream_gbps`)."""
        stream_s = None
        if max_gbps is not None and max_gbps > 0 and duration_s > 0:
            shaped = bytes_ * 8.0 / GBPS_BITS / max_gbps
            stream_s = shaped if shaped > duration_s else None
        if self.lanes <= 0 or not queued:
            transfer = Transfer(bytes_, now_s, duration_s, stream_duration_s=stream_s)
        else:
            ends = self._lane_ends(now_s)
            lane = min(range(self.lanes), key=ends.__getitem__)
            transfer = Transfer(bytes_, ends[lane], duration_s, lane, stream_duration_s=stream_s)
        self._active[key] = transfer
        self._changes += 1
        self._oldest_start_s = min(self._oldest_start_s, transfer.start_s)
        return transfer

    def reserve(self, key: str, transfer: Transfer) -> Transfer:
        """Book a planned stream (a window from :func:`~.link_calendar.earliest_window`) in the calendar."""
        self._active[key] = transfer
        self._changes += 1
        self._oldest_start_s = min(self._oldest_start_s, transfer.start_s)
        return transfer

    def transfers(self, now_s: float) -> list[Transfer]:
        """The calendar: every stream booked or in flight (expired ones dropped)."""
        self._expire(now_s)
        return list(self._active.values())

    def lane_ends(self, now_s: float) -> list[float]:
        """When each lane frees up (empty without lanes)."""
        return list(self._lane_ends(now_s))

    def others_gbps(self, now_s: float, params: LinkParams) -> float:
        """Other replicas' measured egress (0 without a fresh measurement, or when this ledger sees them all)."""
        return self._others_gbps(now_s, params) or 0.0

    def queue_wait_s(self, now_s: float) -> float | None:
        """How long a stream dispatched now would wait for a PrFaaS instance (None without lanes)."""
        if self.lanes <= 0:
            return None
        return min(self._lane_ends(now_s)) - now_s

    def finish(self, key: str) -> None:
        if self._active.pop(key, None) is not None:
            self._changes += 1

    def keys(self, now_s: float) -> list[str]:
        """The keys of every stream booked or in flight (expired ones dropped)."""
        self._expire(now_s)
        return list(self._active)

    def booked(self, now_s: float) -> dict[str, Transfer]:
        """Every stream booked or in flight by key (expired ones dropped): :meth:`keys` with their transfers."""
        self._expire(now_s)
        return dict(self._active)

    def get(self, key: str) -> Transfer | None:
        """The stream booked or in flight under ``key`` (None: none)."""
        return self._active.get(key)

    def _expire(self, now_s: float) -> None:
        expire_s = self.expire_s
        if now_s - self._oldest_start_s <= expire_s:
            return  # every booking started at or after the oldest: none is older than expire_s
        # ``age > expire_s`` first: it cannot hold when ``age > max(...)`` does not, and it fails for nearly every
        # transfer (young), so the ``max`` is rarely computed
        stale = [
            k
            for k, t in self._active.items()
            if now_s - t.start_s > expire_s and now_s - t.start_s > max(expire_s, t.stream_end_s - t.start_s)
        ]
        for k in stale:
            del self._active[k]
        self._changes += len(stale)
        self._oldest_start_s = min((t.start_s for t in self._active.values()), default=math.inf)

    def own_gbps(self, now_s: float) -> float:
        """Sum of the rates of this replica's streams on the wire at ``now_s`` (started, not finished)."""
        self._expire(now_s)
        return sum(t.rate_gbps for t in self._active.values() if t.stream_start_s <= now_s)

    @property
    def in_flight(self) -> int:
        return len(self._active)

    def record_measurement(self, total_gbps: float, now_s: float) -> None:
        """The link's measured total egress (all replicas), as read from its metrics."""
        self._measured_gbps = max(0.0, total_gbps)
        self._measured_at_s = now_s
        self._own_at_measurement_gbps = self.own_gbps(now_s)

    def _others_gbps(self, now_s: float, params: LinkParams) -> float | None:
        """Other replicas' egress: the fresh measurement less this replica's share of it (None: no fresh one)."""
        if self._measured_gbps is None or now_s - self._measured_at_s > params.measurement_max_age_s:
            return None
        return max(0.0, self._measured_gbps - self._own_at_measurement_gbps)

    def estimate_gbps(self, now_s: float, params: LinkParams) -> float:
        """Best estimate of the link's total egress now.

        With a fresh measurement: the measured total corrected by this replica's change since it was taken,
        but never below this replica's own streams — a saturated link measures only its capacity. Without a
        fresh measurement: the own figure.
        """
        own = self.own_gbps(now_s)
        others = self._others_gbps(now_s, params)
        return own if others is None else own + others

    def admission_gbps(self, now_s: float, params: LinkParams) -> float:
        """The egress a new stream would share the wire with, for :func:`admit`.

        Without lanes: everything dispatched counts now (:meth:`estimate_gbps` over all in-flight streams).
        With lanes: the new stream takes the lane that frees first, at ``s``; it will run next to the
        streams past their expected end (still unfinished: summed) and, on each other lane, the heaviest
        stream still scheduled after ``s`` (streams on one lane run one after another).
        """
        self._expire(now_s)
        others = self._others_gbps(now_s, params) or 0.0
        if self.lanes <= 0:
            return others + sum(t.rate_gbps for t in self._active.values())
        ends = self._lane_ends(now_s)
        chosen = min(range(self.lanes), key=ends.__getitem__)
        s = ends[chosen]
        overrun = 0.0
        heaviest = [0.0] * self.lanes
        for t in self._active.values():
            if t.stream_end_s <= now_s or not 0 <= t.lane < self.lanes:
                overrun += t.rate_gbps
            elif t.stream_end_s > s and t.lane != chosen and t.rate_gbps > heaviest[t.lane]:
                heaviest[t.lane] = t.rate_gbps
        return others + overrun + sum(heaviest)


@dataclass(slots=True)
class Admission:
    """One verdict, made per request (slotted, as the request's other values; never mutated)."""

    admitted: bool
    projected_gbps: float
    why: Why
    """Its reason as held (formatted when read: :attr:`reason`)."""

    @property
    def reason(self) -> str:
        return text(self.why)


def admit(estimate_gbps: float, request_gbps: float, params: LinkParams) -> Admission:
    """Admit a remote prefill only while projected egress stays under the cap."""
    projected, cap = estimate_gbps + request_gbps, params.cap_gbps
    if projected <= cap:
        return Admission(True, projected, ("projected egress {:.2f} <= cap {:.2f} Gbps", projected, cap))
    return Admission(
        False, projected, ("projected egress {:.2f} Gbps would exceed the cap {:.2f} Gbps", projected, cap)
    )
