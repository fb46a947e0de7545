"""The link as a scheduled resource: the :class:`~.link_state.EgressLedger`'s transfers read as a reservation
calendar of KV streams (start, end, rate) on the PrFaaS instances' lanes, with the cap as a hard ceiling.

Given a request (its prefill time and ``S_kv``), :func:`earliest_window` answers with the earliest window whose
stream fits under the ceiling next to every stream already booked, and the TTFT predicted through it (window
wait, which includes the PrFaaS queue since a lane is an instance, + prefill + the stream's tail after the last
layer). :meth:`~.link_state.EgressLedger.reserve` books it. A window found here never takes the booked egress above
the ceiling at any instant (property-tested): the ceiling is ``min(cap, available)`` less the other replicas'
measured egress, where *available* is what the link delivers now (:mod:`.link_estimate`).

**Stream timing** is a parameter (:data:`StreamTiming`):

* ``layer-wise`` (the paper's; the simulator's default): a stream starts with its prefill and runs at the
  prefill's production rate ``S_kv / prefill``, ending with the last layer; it may be booked slower (a lower
  rate, ending after the prefill: the tail).
* ``pull-after-prefill`` (vLLM's NixlConnector; the gateway's default for vLLM): the decode side pulls once the
  prefill has answered, so the stream starts when the prefill ends and runs at the rate booked, at most
  ``pull_gbps`` (what one stream achieves).

Candidate rates: layer-wise, the production rate and its halves (down to 1/8); pull-after-prefill, only what
one pull achieves (``pull_gbps``, at most the ceiling): a decode engine pulls at the wire's speed and nothing
paces it to a slower booking, so a pull booked at half its speed would pass the cap next to another (measured:
5.5 Gbps in 1-s windows on a 4-Gbps cap before this rule). Among the earliest feasible start of each rate, the
one ending first wins (the lowest predicted TTFT). Pure; time is a parameter; O(n^2) in the booked streams (tens at
a time).

**A site's egress cap** (a fleet, :mod:`.fleet`): a PrFaaS site's links leave through the same NICs, so a site's
calendar is one ledger for all its links (its lanes are the site's instances) and a booking on one link passes
:class:`SiteCap`: its stream fits under the link's ceiling (bounded by the link's share of the site cap,
:func:`.fleet.site_shares`) next to that link's streams *and* under the site cap next to every stream of the site.
Without it (one link per site, the single pair) nothing changes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from ..names import GBPS_BITS
from .frozen import quick_init
from .link_state import EgressLedger, LinkParams, Transfer

StreamTiming = Literal["layer-wise", "pull-after-prefill"]
STREAM_TIMINGS: tuple[StreamTiming, ...] = ("layer-wise", "pull-after-prefill")
RATE_FRACTIONS = (1.0, 0.5, 0.25, 0.125)
OVERRUN_GRACE_S = 1.0
"""A stream past its planned end but not finished is assumed to run at least this much longer."""
_EPS = 1e-9
_NEW = "\x00new"
"""The key :func:`window_by_deadline` checks the new request's stream under (no booking's key)."""


@dataclass(frozen=True)
class SiteCap:
    """The site egress cap a booking on one of the site's links also fits under (model Gbps). The ledger is then
    the site's (every link's bookings); ``link_keys`` are the keys of this link's own bookings."""

    cap_gbps: float
    """The site's egress cap (its links' streams together)."""
    share_gbps: float
    """This link's share of it (:func:`.fleet.site_shares`): the link's ceiling is at most this."""
    link_keys: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.cap_gbps < 0 or self.share_gbps < 0:
            raise ValueError("site cap_gbps and share_gbps must be >= 0")


@quick_init
@dataclass(frozen=True)
class Window:
    """A window the calendar offers one request (times are absolute, seconds)."""

    start_s: float
    """When its prefill starts on a PrFaaS instance (lane)."""
    stream_start_s: float
    stream_end_s: float
    rate_gbps: float
    lane: int
    now_s: float
    prefill_s: float
    bytes: float
    ceiling_gbps: float
    """The ceiling it was fitted under."""

    def later(self, shift_s: float) -> Window:
        """The same window ``shift_s`` later (earlier when negative): its prefill and its stream move together."""
        return self.moved(shift_s, self.lane)

    def moved(self, shift_s: float, lane: int) -> Window:
        """:meth:`later` on ``lane`` (built directly: ``dataclasses.replace`` is slow on the calendar's hot path)."""
        return Window(
            self.start_s + shift_s,
            self.stream_start_s + shift_s,
            self.stream_end_s + shift_s,
            self.rate_gbps,
            lane,
            self.now_s,
            self.prefill_s,
            self.bytes,
            self.ceiling_gbps,
        )

    @property
    def wait_s(self) -> float:
        """How long the request waits before its prefill starts (link window and PrFaaS queue together)."""
        return self.start_s - self.now_s

    @property
    def ttft_s(self) -> float:
        """Predicted time from now until the decode side holds the whole KV (its first token follows)."""
        return max(self.stream_end_s, self.start_s + self.prefill_s) - self.now_s

    def transfer(self) -> Transfer:
        """The booking :meth:`~.link_state.EgressLedger.reserve` records."""
        return Transfer(
            self.bytes,
            self.start_s,
            self.prefill_s,
            self.lane,
            self.stream_start_s - self.start_s,
            self.stream_end_s - self.stream_start_s,
        )


def paced_instance_gbps(capacity_gbps: float, max_utilization: float, instances: int) -> float:
    """Egress pacing: each PrFaaS instance's egress limited to an equal share of the cap, so that one pull per
    instance fits on the wire at once and together they fill the cap, where unpaced pulls (each as fast as the
    wire lets it) leave the cap partly idle: on a 5-Gbps link (4-Gbps cap) whose pulls run at 2.5 Gbps only one
    fits at a time. It is also what one pull achieves then (the gateway's ``pullGbps``)."""
    if capacity_gbps <= 0 or not 0 < max_utilization <= 1 or instances < 1:
        raise ValueError("capacity_gbps > 0, 0 < max_utilization <= 1 and instances >= 1 required")
    return capacity_gbps * max_utilization / instances


def ceiling_gbps(ledger: EgressLedger, now_s: float, params: LinkParams, available_gbps: float | None = None) -> float:
    """The hard ceiling a new booking must stay under: the cap, bounded by the available bandwidth, less the
    other replicas' measured egress."""
    cap = params.cap_gbps if available_gbps is None else min(params.cap_gbps, available_gbps)
    return max(0.0, cap - ledger.others_gbps(now_s, params))


def _spans(transfers: Iterable[Transfer], now_s: float) -> list[tuple[float, float, float]]:
    """``(start, end, rate)`` of each booked stream; an overrunning one is extended past ``now``."""
    out: list[tuple[float, float, float]] = []
    append = out.append
    grace = now_s + OVERRUN_GRACE_S
    for t in transfers:
        span = t.span
        if span[1] <= grace and span[0] <= now_s:
            span = (span[0], grace, span[2])  # (``max(end, grace)``: the same value, since ``end <= grace``)
        append(span)
    return out


def peak_gbps(spans: Sequence[tuple[float, float, float]], a: float, b: float) -> float:
    """The largest booked egress at any instant of ``[a, b)``."""
    lo, hi = a + _EPS, b - _EPS
    inside = [x for x in spans if x[0] < hi and x[1] > lo]
    if not inside:
        return 0.0
    # the booked egress just after ``a`` and after each start inside, the first largest (sums in span order)
    peak = sum([r for s, e, r in inside if s <= a + _EPS < e])
    for p, _, _ in inside:
        if p > a:
            at = p + _EPS
            booked = sum([r for s, e, r in inside if s <= at < e])
            if booked > peak:
                peak = booked
    return peak


def booked_gbps(transfers: Sequence[Transfer], at_s: float) -> float:
    """The booked egress at one instant (what the property tests sum)."""
    return sum(t.rate_gbps for t in transfers if t.stream_start_s <= at_s < t.stream_end_s)


def earliest_window(
    ledger: EgressLedger,
    now_s: float,
    nbytes: float,
    prefill_s: float,
    params: LinkParams,
    timing: StreamTiming = "layer-wise",
    *,
    pull_gbps: float | None = None,
    available_gbps: float | None = None,
    site: SiteCap | None = None,
) -> Window | None:
    """The window that fits and ends first (see the module docstring); None when the ceiling is 0. With ``site``
    the ledger is the site's and the stream fits under both the link's and the site's ceilings."""
    _check(timing, nbytes, prefill_s)
    return _earliest(ledger, now_s, nbytes, prefill_s, params, timing, pull_gbps, available_gbps, site)[0]


def _check(timing: StreamTiming, nbytes: float, prefill_s: float) -> None:
    if timing not in STREAM_TIMINGS:
        raise ValueError(f"timing: {timing!r} is not one of {', '.join(STREAM_TIMINGS)}")
    if nbytes < 0 or prefill_s < 0:
        raise ValueError("nbytes and prefill_s must be >= 0")


def _earliest(
    ledger: EgressLedger,
    now_s: float,
    nbytes: float,
    prefill_s: float,
    params: LinkParams,
    timing: StreamTiming,
    pull_gbps: float | None,
    available_gbps: float | None,
    site: SiteCap | None,
) -> tuple[Window | None, dict[str, Transfer]]:
    """:func:`earliest_window` (its arguments checked) and the calendar it read (``ledger.booked(now_s)``; empty
    when the ceiling is 0: then the ledger is not read)."""
    ceiling = ceiling_gbps(ledger, now_s, params, available_gbps)
    if site is not None:
        ceiling = min(ceiling, site.share_gbps, site.cap_gbps)
    if ceiling <= _EPS:
        return None, {}
    prefill_s = max(prefill_s, 1e-6)
    gbits = nbytes * 8.0 / GBPS_BITS
    booked = ledger.booked(now_s)
    spans = _spans(booked.values(), now_s)
    link_spans = spans
    if site is not None:
        link_spans = _spans([t for k, t in booked.items() if k in site.link_keys], now_s)
    lane_ends = ledger.lane_ends(now_s) or [now_s]
    first_free = min(lane_ends)
    layer_wise = timing == "layer-wise"
    offset = 0.0 if layer_wise else prefill_s
    if layer_wise:  # (``e - 0.0`` is ``e``)
        candidates = sorted({first_free, *[e for _, e, _ in spans if e > first_free]})
    else:
        candidates = sorted({first_free, *[e - offset for _, e, _ in spans if e - offset > first_free]})
    if gbits <= _EPS:
        rates = [0.0]
    elif layer_wise:
        rates = sorted({min(gbits / prefill_s, ceiling) * f for f in RATE_FRACTIONS}, reverse=True)
    else:  # nothing paces a pull below what it achieves: booked at that rate, or later
        rates = [min(pull_gbps or ceiling, ceiling)]
    limit = ceiling + _EPS
    site_limit = math.inf if site is None else site.cap_gbps + _EPS
    best: Window | None = None
    best_end = 0.0  # ``best.stream_end_s - _EPS`` once there is a best
    for rate in rates:
        span = gbits / rate if rate > 0 else 0.0
        if layer_wise and span < prefill_s:
            span = prefill_s  # (``max(span, prefill_s)``)
        for s in candidates:
            a = s + offset
            b = a + span  # (``s + offset + span``: the same sum, left to right)
            if best is not None and b >= best_end:
                break  # later starts only end later
            if site is not None and not peak_gbps(spans, a, b) + rate <= site_limit:
                continue
            if peak_gbps(link_spans, a, b) + rate <= limit:
                # the lane that frees last by ``s`` (the first of equals; lane 0 when none has)
                lane, top, free_by = 0, None, s + _EPS
                for i, e in enumerate(lane_ends):
                    if e <= free_by and (top is None or e > top):
                        lane, top = i, e
                best = Window(s, a, b, rate, lane if ledger.lanes > 0 else -1, now_s, prefill_s, nbytes, ceiling)
                best_end = b - _EPS
                break
    return best, booked


@quick_init
@dataclass(frozen=True)
class Deadline:
    """A booking's place in :func:`~.link_deadline.window_by_deadline`'s order (absolute model seconds):
    ``due_s``, when its caller wants its first token (its TTFT objective: earliest due goes first), and ``limit_s``,
    the latest its predicted TTFT may be moved to (its due time while it is predicted to make it, else the latest
    its caller accepts)."""

    due_s: float
    limit_s: float

    @classmethod
    def of(cls, predicted_end_s: float, due_s: float, accepted_s: float) -> Deadline:
        """A booking predicted to end at ``predicted_end_s``: one that makes its due time keeps it; one that does not
        keeps only what its caller accepts."""
        return cls(due_s, min(due_s, accepted_s) if predicted_end_s <= due_s + _EPS else accepted_s)


WaitAction = Literal["remote", "wait_for_link", "local"]


@quick_init
@dataclass(frozen=True)
class WaitChoice:
    """Take the window (``remote`` when it starts now, ``wait_for_link`` when it starts later) or go local."""

    action: WaitAction
    remote_ttft_s: float
    local_ttft_s: float
    wait_s: float
    why: str
    """The reason's head (:attr:`reason` adds the figures)."""
    window_wait_s: float | None = None
    """The window's wait (None: there was no window)."""
    slo_ttft_s: float | None = None

    @property
    def reason(self) -> str:
        """Why, with the predicted TTFTs (formatted when read: the simulator asks per request and reads none)."""
        if self.window_wait_s is None:
            return self.why
        fit = (
            f"{self.remote_ttft_s:.2f} s via a window at +{self.window_wait_s:.2f} s vs local {self.local_ttft_s:.2f} s"
        )
        if self.slo_ttft_s is not None:
            fit += f" (SLO {self.slo_ttft_s:.2f} s)"
        return f"{self.why}: predicted TTFT {fit}"


def choose_window(
    window: Window | None,
    local_ttft_s: float,
    slo_ttft_s: float | None = None,
    local_wait_s: float = 0.0,
    spill: bool = False,
) -> WaitChoice:
    """A remote candidate (its uncached length above ``t``, or a ``spill``) against its local alternative, the SLO
    in mind. A window that starts now is taken. A later one is waited for unless the remote misses the request's
    TTFT SLO while local fits it *and* a PD prefill instance is idle (``local_wait_s`` 0): ``t`` sent the request
    remote because a long prefill taken locally delays every request queued behind it (in the simulator, 19 long
    requests sent local at 5 Gbps made 124 others miss their SLO), so a request neither side can serve in time
    still waits. Without an SLO: by predicted TTFT.

    A spill (a request ``t`` kept local, sent remote because PD's prefill queue surged) is short: it never waits
    *for the link* longer than it gains — it takes a later window only while its predicted TTFT through it still
    beats local's (the window's wait includes the PrFaaS queue its spill decision already priced), so a spill no
    longer bounces back to the surged queue just because no PrFaaS lane is free this instant."""
    if window is None:
        return WaitChoice("local", float("inf"), local_ttft_s, 0.0, "no link window (ceiling 0): local prefill")
    remote, wait = window.ttft_s, window.wait_s
    if wait <= 1e-6:
        return WaitChoice("remote", remote, local_ttft_s, 0.0, "link window now", wait, slo_ttft_s)
    if not prefer_local(remote, local_ttft_s, slo_ttft_s, local_wait_s, spill):
        what = "spill waits for the link" if spill else "wait for the link"
        return WaitChoice("wait_for_link", remote, local_ttft_s, wait, what, wait, slo_ttft_s)
    return WaitChoice("local", remote, local_ttft_s, wait, "local prefill", wait, slo_ttft_s)


def prefer_local(
    remote_ttft_s: float,
    local_ttft_s: float,
    slo_ttft_s: float | None = None,
    local_wait_s: float = 0.0,
    spill: bool = False,
) -> bool:
    """The rule of :func:`choose_window` on predicted TTFTs alone (a router judging a gateway's decline)."""
    if spill or slo_ttft_s is None:
        return remote_ttft_s > local_ttft_s
    return remote_ttft_s > slo_ttft_s >= local_ttft_s and local_wait_s <= 1e-6


def accepted_ttft_s(local_ttft_s: float, slo_ttft_s: float | None, spill: bool) -> float:
    """The latest remote TTFT a router accepts (``x-prfaas-max-ttft-ms``): a spill's local alternative's predicted
    TTFT; otherwise the later of that and the request's SLO."""
    return local_ttft_s if spill else max(local_ttft_s, slo_ttft_s or 0.0)


def max_wait_s(local_ttft_s: float, prefill_s: float, nbytes: float, ceiling: float) -> float:
    """The longest window wait a router accepts: the one at which the remote TTFT (wait + prefill + the stream
    at the ceiling, at best) would equal the local alternative's predicted TTFT."""
    stream = nbytes * 8.0 / GBPS_BITS / ceiling if ceiling > 0 else float("inf")
    return max(0.0, local_ttft_s - max(prefill_s, stream))
