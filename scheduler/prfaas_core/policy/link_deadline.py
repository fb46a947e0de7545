"""The calendar's earliest-deadline-first placement (:func:`window_by_deadline`): a request due sooner may go ahead of
the bookings held on a lane that are due later, as long as each stays within what its caller accepts and every
stream stays under the ceiling (:mod:`.link_calendar`'s rule). Pure; time is a parameter."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .frozen import quick_init

# the calendar's own tolerance, key of the new stream, checks and earliest window: one rule, read from there
from .link_calendar import _EPS, _NEW, Deadline, SiteCap, StreamTiming, Window, _check, _earliest, peak_gbps
from .link_state import EgressLedger, LinkParams, Transfer


@quick_init
@dataclass(frozen=True)
class Placement:
    """A window for one request and the bookings moved back to make room for it (key -> their new times)."""

    window: Window
    moved: dict[str, Transfer]


def _ttft_end(t: Transfer) -> float:
    """When the decode side holds the whole KV of a booking (absolute)."""
    return max(t.stream_end_s, t.end_s)


def _fits(
    spans: dict[str, tuple[float, float, float]],
    changed: dict[str, Transfer],
    ceiling: float,
    site: SiteCap | None = None,
) -> bool:
    """Every stream in ``changed`` fits under ``ceiling`` next to all the others placed (``spans``: every booking's
    ``(stream start, stream end, rate)`` by key, ``changed`` among them; with ``site``: next to its link's others,
    and under the site cap next to all)."""
    limit = ceiling + _EPS
    keys, every = list(spans), list(spans.values())
    for key, t in changed.items():
        if t.rate_gbps <= _EPS or t.bytes <= 0:
            continue
        start, end, rate = spans[key]
        i = keys.index(key)
        others = every[:i] + every[i + 1 :]  # (every span but its own, in order)
        if site is not None:
            mine = site.link_keys | {_NEW}
            link = [span for k, span in spans.items() if k != key and k in mine]
            if peak_gbps(others, start, end) + rate > site.cap_gbps + _EPS:
                return False
            others = link
        if peak_gbps(others, start, end) + rate > limit:
            return False
    return True


def _start_s(kt: tuple[str, Transfer]) -> float:
    return kt[1].start_s


def window_by_deadline(
    ledger: EgressLedger,
    now_s: float,
    nbytes: float,
    prefill_s: float,
    params: LinkParams,
    timing: StreamTiming = "layer-wise",
    *,
    due_s: float,
    deadlines: Mapping[str, Deadline],
    pull_gbps: float | None = None,
    available_gbps: float | None = None,
    site: SiteCap | None = None,
) -> Placement | None:
    """:func:`earliest_window`, earliest deadline first on the lanes: when that window waits for a lane, the request
    (due at ``due_s``: its TTFT objective, absolute) may go ahead of bookings on a lane that have not started yet
    and are due later (``deadlines``), as long as each stays within its :attr:`Deadline.limit_s` once moved back by
    its prefill, and every moved stream and its own stay under the ceiling. Of the placements that end earlier
    than :func:`earliest_window`'s, the one that ends first wins (ties: fewer moved). Arrival order otherwise: a
    short request with a tight objective no longer waits out a long prefill booked a moment earlier with seconds
    of slack (measured at 100 Gbps: spills held up to 8 s behind such bookings, missing their SLO). A booking
    without a deadline never moves, nor one that has started (its start not after ``now_s``); a request that would
    miss its own due time even ahead of them moves nobody. With ``site`` (a site's calendar) it goes ahead only of
    its own link's bookings, and every moved stream fits under the site cap too."""
    _check(timing, nbytes, prefill_s)
    base, booked = _earliest(ledger, now_s, nbytes, prefill_s, params, timing, pull_gbps, available_gbps, site)
    if base is None or base.wait_s <= _EPS or ledger.lanes <= 0 or not due_s < float("inf"):
        return None if base is None else Placement(base, {})
    prefill_s = base.prefill_s
    best: Placement | None = None
    base_ttft, best_ttft = base.ttft_s, math.inf  # (best_ttft: the best placement's)
    horizon = now_s + _EPS
    booked_spans: dict[str, tuple[float, float, float]] | None = None  # (made for the first placement checked)
    lanes: dict[int, list[tuple[str, Transfer]]] = {}
    last: dict[int, tuple[str, Transfer]] = {}
    """Each lane's last booking pending (not started by ``horizon``): the latest start, the last booked of equals
    (the last pending once the lane is sorted, stably, by start)."""
    for kt in booked.items():  # one pass (in booking order, as the stable sort below expects)
        t = kt[1]
        on_lane = lanes.get(t.lane)
        if on_lane is None:
            lanes[t.lane] = [kt]
        else:
            on_lane.append(kt)
        if t.start_s > horizon:
            held = last.get(t.lane)
            if held is None or t.start_s >= held[1].start_s:
                last[t.lane] = kt
    # (``base``'s times and the bounds each candidate is held to, read once: the same values as inline)
    b_start, b_end, b_now = base.start_s, base.stream_end_s, base.now_s
    due_limit, base_limit, best_limit = due_s + _EPS, base_ttft - _EPS, best_ttft - _EPS
    for lane in range(ledger.lanes):
        held = last.get(lane)
        due_last = None if held is None else deadlines.get(held[0])
        if due_last is None or due_last.due_s <= due_s:
            continue  # the loop below would stop at its first step (earliest deadline first)
        on_lane = lanes[lane]
        on_lane.sort(key=_start_s)
        pending: list[tuple[str, Transfer]] = []
        free_at = now_s  # (the latest end of those started, at least now)
        for kt in on_lane:
            t = kt[1]
            if t.start_s > horizon:
                pending.append(kt)
            elif t.end_s > free_at:
                free_at = t.end_s
        for i in range(len(pending) - 1, -1, -1):
            k = pending[i][0]  # the later ones in ``jumped`` passed this test in the earlier rounds
            due_k = deadlines.get(k)
            if due_k is None or due_k.due_s <= due_s:
                break  # earliest deadline first: never ahead of one whose deadline is as early (or unknown)
            jumped = pending[i:]
            if site is not None and any(k not in site.link_keys for k, _ in jumped):
                break  # another link's booking: its own link's ceiling is not this one's
            start = max(free_at, pending[i - 1][1].end_s) if i > 0 else free_at
            shift = start - b_start
            # ``base.moved(shift, lane).ttft_s`` without building the window (most candidates stop here)
            ttft = max(b_end + shift, b_start + shift + prefill_s) - b_now
            if now_s + ttft > due_limit:
                continue  # a request that misses its own due time even so moves nobody
            if ttft >= base_limit or ttft >= best_limit:
                continue
            moved: dict[str, Transfer] = {}
            prev_end = start + prefill_s
            late = False
            for k, t in jumped:
                if t.start_s >= prev_end - _EPS:
                    break  # a gap took the shift up: this one and the rest stay where they are
                moved[k] = shifted = Transfer(
                    t.bytes, prev_end, t.duration_s, t.lane, t.stream_offset_s, t.stream_duration_s
                )
                prev_end = shifted.end_s
                if _ttft_end(shifted) > deadlines[k].limit_s + _EPS:
                    late = True  # moved back past what its caller accepts: no placement
                    break
            if late:
                continue
            mine = base.moved(shift, lane)
            if booked_spans is None:
                booked_spans = {k: t.span for k, t in booked.items()}
            new = mine.transfer()
            # every stream as placed: the calendar's, those moved back at their new times, and the new one (in the
            # order ``{**booked, **moved, _NEW: new}`` gives them), each checked next to the others
            spans = {**booked_spans, **{k: t.span for k, t in moved.items()}, _NEW: new.span}
            if _fits(spans, {_NEW: new, **moved}, base.ceiling_gbps, site):
                best = Placement(mine, moved)
                best_limit = ttft - _EPS
    return best or Placement(base, {})
