"""Link state: egress estimate, scarce/abundant with hysteresis, and admission under the cap.

Thresholds (ARCHITECTURE.md): the cap ``capacity x maxUtilization`` is a ceiling enforced by admission — a
remote prefill is admitted only while projected egress stays under it. The *scarce* state starts at
``scarceWatermark x cap`` and ends only below ``abundantWatermark x cap`` (hysteresis), so ``t`` rises
before the cap is reached.

Many routers share one link, so a replica's estimate is the link's *measured* total (read about once a
second, so slightly stale) corrected by this replica's own change in in-flight egress since that
measurement; with no fresh measurement it falls back to its own in-flight egress.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from ..names import GBPS_BITS

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
    return replace(prev, egress_gbps=egress_gbps)


@dataclass(frozen=True)
class Transfer:
    """One KV stream this replica started: ``bytes`` over ``[start_s, start_s + duration_s]``."""

    bytes: float
    start_s: float
    duration_s: float

    @property
    def rate_gbps(self) -> float:
        return self.bytes * 8.0 / max(self.duration_s, 1e-9) / GBPS_BITS


@dataclass
class EgressLedger:
    """This replica's in-flight KV streams on one link (a small state machine; time is a parameter).

    ``start`` when a remote prefill is dispatched (its KV streams during prefill, layer-wise), ``finish``
    when it completes or fails; a transfer past its expected end counts until ``finish`` or ``expire_s``.
    """

    expire_s: float = 120.0
    _active: dict[str, Transfer] = field(default_factory=dict)
    _measured_gbps: float | None = None
    _measured_at_s: float = 0.0
    _own_at_measurement_gbps: float = 0.0

    def start(self, key: str, bytes_: float, now_s: float, duration_s: float) -> None:
        self._active[key] = Transfer(bytes_, now_s, duration_s)

    def finish(self, key: str) -> None:
        self._active.pop(key, None)

    def own_gbps(self, now_s: float) -> float:
        """Sum of the rates of this replica's streams in flight at ``now_s``."""
        stale = [k for k, t in self._active.items() if now_s - t.start_s > max(self.expire_s, t.duration_s)]
        for k in stale:
            del self._active[k]
        return sum(t.rate_gbps for t in self._active.values())

    @property
    def in_flight(self) -> int:
        return len(self._active)

    def record_measurement(self, total_gbps: float, now_s: float) -> None:
        """The link's measured total egress (all replicas), as read from its metrics."""
        self._measured_gbps = max(0.0, total_gbps)
        self._measured_at_s = now_s
        self._own_at_measurement_gbps = self.own_gbps(now_s)

    def estimate_gbps(self, now_s: float, params: LinkParams) -> float:
        """Best estimate of the link's total egress, present and committed.

        With a fresh measurement: the measured total corrected by this replica's change since it was taken,
        but never below this replica's own admitted streams — streams admitted at dispatch may still wait
        in the PrFaaS queue and will cross the link later, and a saturated link measures only its capacity.
        Counting them keeps admitted egress under the cap (what admission guarantees); the price is that a
        long PrFaaS queue makes the link look busier than the wire is (see the notes of the simulator issue).
        Without a fresh measurement: the own figure.
        """
        own = self.own_gbps(now_s)
        if self._measured_gbps is None or now_s - self._measured_at_s > params.measurement_max_age_s:
            return own
        return max(own, self._measured_gbps + own - self._own_at_measurement_gbps)


@dataclass(frozen=True)
class Admission:
    admitted: bool
    projected_gbps: float
    reason: str


def admit(estimate_gbps: float, request_gbps: float, params: LinkParams) -> Admission:
    """Admit a remote prefill only while projected egress stays under the cap."""
    projected = estimate_gbps + request_gbps
    if projected <= params.cap_gbps:
        return Admission(True, projected, f"projected egress {projected:.2f} <= cap {params.cap_gbps:.2f} Gbps")
    return Admission(
        False, projected, f"projected egress {projected:.2f} Gbps would exceed the cap {params.cap_gbps:.2f} Gbps"
    )
