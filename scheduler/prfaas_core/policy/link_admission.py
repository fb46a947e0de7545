"""The gateway's admission: the one decision that books a remote prefill's window on the link or declines it,
and the turn a held answer takes onto the wire. Pure; time is a parameter.

The real gateway (``prfaas_router``'s admission: headers in, holds, timers, leases and the 429 body out) and the
simulator's gateway (:mod:`prfaas_core.sim.gateway`) both call :func:`admit` and apply its :class:`Booking` with
:func:`book`; nobody composes the calendar's calls again. The rules, in order:

1. the calendar's window (:func:`~.link_deadline.window_by_deadline` with the lane order ``deadline``: a request
   due sooner may go ahead of held bookings due later; ``arrival``: :func:`~.link_calendar.earliest_window`'s
   order, first booked first served); none when the ceiling is 0 (``overloaded``);
2. a window that starts later than the caller's ``max_wait_s`` (``link_window``, with the earliest start);
3. a window that does not start now and whose predicted TTFT passes the caller's ``max_ttft_s`` (``link_window``);
4. the TTFT *through the instances* (their real queues and paced egress: ``ready_s``, when the best PrFaaS
   instance could start the stream) past ``max_ttft_s``, even for a window that starts now (``link_window``);
5. a window that waits while ``max_waiting`` prefills already wait for theirs (``overloaded``).

In a fleet (``AdmitTick.site``) the calendar is the site's, and rule 1's window fits the link and the site egress
cap together (:class:`~.link_calendar.SiteCap`; the sharing rule between the site's links: :mod:`.fleet`).

A booking carries the bookings it moved back and its own :class:`~.link_calendar.Deadline` (with the lane order
``deadline``), so that later requests can be ordered against it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Literal

from .frozen import quick_init
from .link_calendar import Deadline, SiteCap, StreamTiming, Window
from .link_deadline import window_by_deadline
from .link_state import EgressLedger, LinkParams, Transfer

LaneOrder = Literal["deadline", "arrival"]
LANE_ORDERS: tuple[LaneOrder, ...] = ("deadline", "arrival")
DeclineReason = Literal["link_window", "overloaded"]
_EPS = 1e-9


@quick_init
@dataclass(frozen=True)
class AdmitTick:
    """One remote prefill asking for a window (times in model seconds; limits relative to ``now_s``)."""

    now_s: float
    nbytes: float
    """KV bytes its stream carries."""
    prefill_s: float
    """Its predicted prefill time on a PrFaaS instance."""
    params: LinkParams
    """The link as this calendar plans it (a replica's share, bounded by the available bandwidth)."""
    timing: StreamTiming = "layer-wise"
    lane_order: LaneOrder = "deadline"
    slo_ttft_s: float = math.inf
    """Its TTFT objective (:func:`prfaas_core.request.slo.ttft_objective_s`): when it is due."""
    max_wait_s: float = math.inf
    """The longest window wait its caller accepts."""
    max_ttft_s: float = math.inf
    """The latest predicted TTFT its caller accepts."""
    accepted_ttft_s: float | None = None
    """The latest TTFT its booking may be moved back to once it misses its objective (default ``max_ttft_s``)."""
    ready_s: float | None = None
    """When the best PrFaaS instance could have prefilled it and have its egress free (None: the lanes say)."""
    waiting: int = 0
    """Prefills already waiting for their window."""
    max_waiting: float = math.inf
    pull_gbps: float | None = None
    """What one pull achieves (pull-after-prefill)."""
    site: SiteCap | None = None
    """A fleet site's egress cap (the ledger is then the site's calendar, every link's bookings): the window fits
    under the link's ceiling, bounded by its share of the site cap, and under the site cap (:mod:`.fleet`)."""


@quick_init
@dataclass(frozen=True)
class Booking:
    """Book ``window`` (with :func:`book`); ``predicted_ttft_s`` is its window's, or later through the instances."""

    window: Window
    predicted_ttft_s: float
    moved: Mapping[str, Transfer] = field(default_factory=dict)
    """Bookings moved back to make room (key -> their new times)."""
    deadline: Deadline | None = None
    reason: str = "booked"


@dataclass(frozen=True)
class Decline:
    """No booking: why (``reason`` a metric label, ``message`` for people) and the earliest window if any."""

    reason: DeclineReason
    window: Window | None
    message: str


# --- What a router claims, verified: the gateway counts the prompt itself (it has the model profile) -------------

CLAIM_TOLERANCE = 0.10
"""A router's claimed KV bytes within this fraction of the gateway's own count stand (a router counts the bytes its
decode still needs a little differently); beyond it the gateway books its own count."""
ClaimName = Literal["kv_bytes", "decode_cached", "slo_ttft"]
CLAIMS: tuple[ClaimName, ...] = ("kv_bytes", "decode_cached", "slo_ttft")


@dataclass(frozen=True)
class Verified:
    """The claims as the gateway books them, and those it corrected (a metric label each)."""

    nbytes: float
    slo_ttft_s: float
    corrected: tuple[ClaimName, ...] = ()


def verify_claims(claimed_bytes: float, own_bytes: float, slo_ttft_s: float, slo_floor_s: float | None) -> Verified:
    """A router's claimed KV bytes against the gateway's ``own_bytes`` (the prompt it sees; more than
    :data:`CLAIM_TOLERANCE` apart: its own count, corrected), and its claimed TTFT objective against the SLO the
    gateway is configured with (``slo_floor_s``; a tighter claim would move its request ahead of others held:
    raised to the floor, corrected). ``x-prfaas-kv-bytes: 0`` once skipped the pull accounting; a caller's tight
    ``x-prfaas-slo-ttft-ms`` moved a request from 6th to 3rd."""
    corrected: list[ClaimName] = []
    nbytes = claimed_bytes
    if abs(claimed_bytes - own_bytes) > CLAIM_TOLERANCE * own_bytes:
        nbytes = own_bytes
        corrected.append("kv_bytes")
    slo = slo_ttft_s
    if slo_floor_s is not None and slo_ttft_s < slo_floor_s * (1.0 - CLAIM_TOLERANCE):
        slo = slo_floor_s
        corrected.append("slo_ttft")
    return Verified(nbytes, slo, tuple(corrected))


def verify_decode_cached(claimed_tokens: int, prompt_tokens: int) -> tuple[int, bool]:
    """A router's claim that its decode holds the first ``claimed_tokens`` of the prompt (the KV it will not pull):
    at most the prompt but its last token (the decode computes that one itself); a larger claim is no claim (0) and
    corrected (True). Within the bound the gateway cannot see the decode's cache: a token holder can still
    under-claim there (docs/hardening.md)."""
    if claimed_tokens > max(0, prompt_tokens - 1):
        return 0, True
    return claimed_tokens, False


def through_instances(window: Window, ready_s: float) -> Window:
    """``window`` no earlier than the instances allow: its prefill ends, and its stream can start after the prefill,
    at ``ready_s`` from now at the earliest (the stream's tail after the prefill unchanged)."""
    shift = max(0.0, window.now_s + ready_s - (window.start_s + window.prefill_s))
    return window.later(shift) if shift > 0 else window


def admit(ledger: EgressLedger, deadlines: Mapping[str, Deadline], tick: AdmitTick) -> Booking | Decline:
    """The gateway's answer to one remote prefill (the module docstring's rules, in order). Reads the calendar
    (``ledger``) and the bookings' deadlines; changes nothing."""
    if tick.lane_order not in LANE_ORDERS:
        raise ValueError(f"lane_order: {tick.lane_order!r} is not one of {', '.join(LANE_ORDERS)}")
    due = tick.now_s + tick.slo_ttft_s if tick.lane_order == "deadline" else math.inf
    placement = window_by_deadline(
        ledger,
        tick.now_s,
        tick.nbytes,
        tick.prefill_s,
        tick.params,
        tick.timing,
        due_s=due,
        deadlines=deadlines,
        pull_gbps=tick.pull_gbps,
        site=tick.site,
    )
    if placement is None:
        return Decline("overloaded", None, "the link's ceiling is 0")
    window = placement.window
    wait, ttft = window.wait_s, window.ttft_s  # (read once: properties)
    if wait > tick.max_wait_s:
        return Decline("link_window", window, f"earliest window in {wait:.3f} s")
    if wait > 0 and ttft > tick.max_ttft_s:
        why = f"earliest window in {wait:.3f} s gives a predicted TTFT of {ttft:.3f} s"
        return Decline("link_window", window, f"{why} > {tick.max_ttft_s:.3f} s accepted")
    late = window if tick.ready_s is None else through_instances(window, tick.ready_s)
    late_ttft = ttft if late is window else late.ttft_s
    if late_ttft > ttft + _EPS and late_ttft > tick.max_ttft_s:
        why = f"the PrFaaS instances' queues and egress give a predicted TTFT of {late_ttft:.3f} s"
        return Decline("link_window", late, f"{why} > {tick.max_ttft_s:.3f} s accepted")
    if wait > 0 and tick.waiting >= tick.max_waiting:
        return Decline("overloaded", window, f"{tick.waiting} prefills already wait for a window")
    predicted = max(ttft, late_ttft)
    deadline = None
    if math.isfinite(due):
        limit = tick.max_ttft_s if tick.accepted_ttft_s is None else tick.accepted_ttft_s
        deadline = Deadline.of(tick.now_s + predicted, due, tick.now_s + limit)
    return Booking(window, predicted, placement.moved, deadline)


def book(ledger: EgressLedger, deadlines: MutableMapping[str, Deadline], key: str, booking: Booking) -> None:
    """Apply ``booking`` under ``key``: the bookings it moved back take their new times, its window is reserved and
    its deadline kept (deadlines of bookings no longer in the calendar are dropped)."""
    for moved, transfer in booking.moved.items():
        ledger.reserve(moved, transfer)
    ledger.reserve(key, booking.window.transfer())
    for gone in [k for k in deadlines if ledger.get(k) is None]:
        del deadlines[gone]
    if booking.deadline is not None:
        deadlines[key] = booking.deadline


WireTurn = Literal["go", "wait", "borrow"]


@dataclass(frozen=True)
class WireTick:
    """A held answer's pull asking to go on the wire now."""

    instance_full: bool
    """Its PrFaaS instance's paced egress has no room for it."""
    older_peer_first: bool
    """A peer replica's older held answer still misses some of this replica's share."""
    missing: float
    """The share of the link it misses to go now (0: it fits next to the pulls on the wire)."""
    oldest_here: bool
    """It is this replica's oldest held answer (only that one borrows: the replicas take turns by them)."""


def wire_turn(tick: WireTick) -> WireTurn:
    """``go`` onto the wire, ``wait`` (re-check when the wire changes) or ``borrow`` what it misses from the peers'
    idle shares (all or nothing): a full instance and an older peer's turn come first, then the fit."""
    if tick.instance_full or tick.older_peer_first:
        return "wait"
    if tick.missing <= _EPS:
        return "go"
    return "borrow" if tick.oldest_here else "wait"
