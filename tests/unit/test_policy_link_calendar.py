"""The link scheduler: reservation calendar on the EgressLedger's lanes, the cap a hard ceiling."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prfaas_core.names import GBPS_BITS
from prfaas_core.policy.link_calendar import (
    Deadline,
    booked_gbps,
    choose_window,
    earliest_window,
    max_wait_s,
)
from prfaas_core.policy.link_deadline import window_by_deadline
from prfaas_core.policy.link_state import EgressLedger, LinkParams

LINK = LinkParams("l", capacity_gbps=10.0, max_utilization=0.8)  # cap 8 Gbps


def gbytes(gbits: float) -> float:
    return gbits * GBPS_BITS / 8.0


def test_empty_calendar_starts_now_at_the_production_rate() -> None:
    ledger = EgressLedger(lanes=2)
    w = earliest_window(ledger, 10.0, gbytes(12.0), 2.0, LINK)  # 6 Gbps for 2 s
    assert w is not None
    assert w.start_s == 10.0 and w.wait_s == 0.0
    assert w.rate_gbps == pytest.approx(6.0)
    assert w.ttft_s == pytest.approx(2.0)


def test_second_stream_waits_for_the_first_or_goes_slower_whichever_ends_first() -> None:
    ledger = EgressLedger(lanes=4)
    first = earliest_window(ledger, 0.0, gbytes(12.0), 2.0, LINK)
    assert first is not None
    ledger.reserve("a", first.transfer())
    w = earliest_window(ledger, 0.0, gbytes(12.0), 2.0, LINK)
    assert w is not None
    # 6 + 6 > 8: either start at 2 s at 6 Gbps (ends at 4 s) or now at 1.5 Gbps (8 s): waiting wins
    assert w.start_s == pytest.approx(2.0)
    assert w.ttft_s == pytest.approx(4.0)
    assert w.rate_gbps == pytest.approx(6.0)


def test_a_slower_booking_wins_when_the_wait_is_long() -> None:
    ledger = EgressLedger(lanes=4)
    long = earliest_window(ledger, 0.0, gbytes(60.0), 10.0, LINK)  # 6 Gbps for 10 s
    assert long is not None
    ledger.reserve("long", long.transfer())
    w = earliest_window(ledger, 0.0, gbytes(4.0), 1.0, LINK)  # 4 Gbps for 1 s does not fit next to 6
    assert w is not None
    assert w.start_s == 0.0  # 2 Gbps fits now (ends at 2 s) instead of waiting 10 s
    assert w.rate_gbps == pytest.approx(2.0)
    assert w.ttft_s == pytest.approx(2.0)


def test_lanes_queue_the_prefill() -> None:
    ledger = EgressLedger(lanes=1)
    a = earliest_window(ledger, 0.0, gbytes(1.0), 5.0, LINK)
    assert a is not None
    ledger.reserve("a", a.transfer())
    b = earliest_window(ledger, 0.0, gbytes(1.0), 5.0, LINK)
    assert b is not None
    assert b.start_s == pytest.approx(5.0)  # the only PrFaaS instance is busy until then


def test_pull_after_prefill_streams_after_the_prefill() -> None:
    ledger = EgressLedger(lanes=2)
    w = earliest_window(ledger, 0.0, gbytes(8.0), 3.0, LINK, "pull-after-prefill", pull_gbps=4.0)
    assert w is not None
    assert w.stream_start_s == pytest.approx(3.0)
    assert w.rate_gbps == pytest.approx(4.0)
    assert w.ttft_s == pytest.approx(5.0)
    ledger.reserve("w", w.transfer())
    assert ledger.lane_ends(0.0)[w.lane] == pytest.approx(3.0)  # the lane frees when the prefill ends


def test_a_pull_is_booked_at_the_speed_it_runs_never_slower() -> None:
    """Nothing paces a decode engine's pull: two pulls at 5 Gbps do not fit an 8-Gbps cap together, so the
    second starts when the first ends instead of being booked at half speed beside it (which the wire ignores)."""
    ledger = EgressLedger(lanes=2)
    first = earliest_window(ledger, 0.0, gbytes(20.0), 1.0, LINK, "pull-after-prefill", pull_gbps=5.0)
    assert first is not None and first.stream_end_s == pytest.approx(5.0)
    ledger.reserve("a", first.transfer())
    # at half speed beside the first it would end at 5 s, waiting ends at 7 s: only the second is true
    second = earliest_window(ledger, 0.0, gbytes(10.0), 1.0, LINK, "pull-after-prefill", pull_gbps=5.0)
    assert second is not None
    assert second.rate_gbps == pytest.approx(5.0)
    assert second.stream_start_s == pytest.approx(5.0) and second.stream_end_s == pytest.approx(7.0)
    assert max(booked_gbps([first.transfer(), second.transfer()], t / 10) for t in range(80)) == pytest.approx(5.0)


def test_available_bandwidth_and_other_replicas_lower_the_ceiling() -> None:
    ledger = EgressLedger(lanes=2)
    w = earliest_window(ledger, 0.0, gbytes(12.0), 2.0, LINK, available_gbps=3.0)
    assert w is not None and w.rate_gbps <= 3.0 + 1e-9
    ledger.record_measurement(8.0, 0.0)  # others fill the cap
    assert earliest_window(ledger, 0.0, gbytes(1.0), 1.0, LINK) is None


def test_bad_timing_is_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="timing"):
        earliest_window(EgressLedger(), 0.0, 1.0, 1.0, LINK, "eager")  # type: ignore[arg-type]


def test_choice_waits_only_when_it_pays() -> None:
    ledger = EgressLedger(lanes=1)
    a = earliest_window(ledger, 0.0, gbytes(6.0), 1.0, LINK)
    assert a is not None
    ledger.reserve("a", a.transfer())
    w = earliest_window(ledger, 0.0, gbytes(6.0), 1.0, LINK)
    assert w is not None and w.wait_s > 0
    assert choose_window(w, local_ttft_s=10.0, slo_ttft_s=5.0).action == "wait_for_link"
    assert choose_window(w, local_ttft_s=1.5, slo_ttft_s=None).action == "local"
    assert "SLO 2.50 s" in choose_window(w, local_ttft_s=3.0, slo_ttft_s=2.5).reason
    # remote fits the SLO: it waits even though local would be faster (t sent it remote)
    assert choose_window(w, local_ttft_s=1.5, slo_ttft_s=2.5).action == "wait_for_link"
    # remote misses the SLO, local fits it and a PD prefill instance is idle: local
    assert choose_window(w, local_ttft_s=1.5, slo_ttft_s=1.8).action == "local"
    # ... but not behind a local queue (a long local prefill would delay everything queued behind it)
    assert choose_window(w, local_ttft_s=1.5, slo_ttft_s=1.8, local_wait_s=0.5).action == "wait_for_link"
    # a spill (a short request sent remote for a PD queue surge) waits only while it beats local, SLO or not
    remote = w.ttft_s
    spill = choose_window(w, local_ttft_s=remote + 0.5, slo_ttft_s=1.0, local_wait_s=0.5, spill=True)
    assert spill.action == "wait_for_link" and "spill waits" in spill.reason
    assert choose_window(w, local_ttft_s=remote - 0.1, slo_ttft_s=remote + 1.0, spill=True).action == "local"
    assert choose_window(w, local_ttft_s=remote - 0.1, slo_ttft_s=1.0, local_wait_s=0.5, spill=True).action == "local"
    now = earliest_window(EgressLedger(lanes=1), 0.0, gbytes(6.0), 1.0, LINK)
    assert choose_window(now, 0.5, None).action == "remote"
    assert choose_window(now, 0.5, None, spill=True).action == "remote"  # a window now is taken
    assert choose_window(None, 3.0, None).action == "local"
    assert max_wait_s(10.0, 2.0, gbytes(8.0), 8.0) == pytest.approx(8.0)


requests = st.lists(
    st.tuples(
        st.floats(0.0, 20.0),  # arrival offset
        st.floats(0.01, 40.0),  # Gbit of KV
        st.floats(0.05, 8.0),  # prefill seconds
        st.sampled_from(["layer-wise", "pull-after-prefill"]),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(requests, st.integers(0, 4), st.floats(1.0, 100.0))
def test_bookings_never_exceed_the_cap(reqs, lanes, capacity) -> None:  # type: ignore[no-untyped-def]
    params = LinkParams("p", capacity_gbps=capacity)
    ledger = EgressLedger(lanes=lanes, expire_s=1e9)
    now = 0.0
    for i, (dt, gbit, prefill, timing) in enumerate(sorted(reqs)):
        now = max(now, dt)
        w = earliest_window(ledger, now, gbytes(gbit), prefill, params, timing, pull_gbps=capacity)
        assert w is not None and w.start_s >= now - 1e-9
        ledger.reserve(str(i), w.transfer())
    booked = ledger.transfers(now)
    for t in booked:  # just after each start (a stream that ends as another starts may round to 1e-15 s)
        for at in (t.stream_start_s + 1e-7, (t.stream_start_s + t.stream_end_s) / 2):
            assert booked_gbps(booked, at) <= params.cap_gbps + 1e-6


# --- earliest deadline first on the lanes (laneOrder: deadline) ---------------------------------------------------
FAST = LinkParams("fast", capacity_gbps=100.0, max_utilization=0.8)  # cap 80: the lanes bind, not the link


def test_deadline_keeps_a_due_time_it_makes_else_only_what_its_caller_accepts() -> None:
    assert Deadline.of(5.0, 6.0, 9.0) == Deadline(6.0, 6.0)  # makes its objective: kept within it
    assert Deadline.of(7.0, 6.0, 9.0) == Deadline(6.0, 9.0)  # misses it anyway: only the caller's bound
    assert Deadline.of(5.0, 6.0, 5.5) == Deadline(6.0, 5.5)


def test_a_tight_due_time_goes_ahead_of_a_held_booking_with_slack() -> None:
    ledger = EgressLedger(lanes=1)
    running = earliest_window(ledger, 0.0, gbytes(8.0), 4.0, FAST, "pull-after-prefill", pull_gbps=40.0)
    assert running is not None
    ledger.reserve("running", running.transfer())  # prefills 0-4 s
    held = earliest_window(ledger, 1.0, gbytes(8.0), 4.0, FAST, "pull-after-prefill", pull_gbps=40.0)
    assert held is not None and held.start_s == pytest.approx(4.0)
    ledger.reserve("held", held.transfer())  # held for 4-8 s, due at 20 s
    deadlines = {"running": Deadline(10.0, 10.0), "held": Deadline(20.0, 20.0)}
    short = window_by_deadline(
        ledger, 2.0, gbytes(0.4), 0.5, FAST, "pull-after-prefill", due_s=6.0, deadlines=deadlines, pull_gbps=40.0
    )
    assert short is not None
    # in arrival order it would start at 8 s (TTFT 6.5 s, due at +4 s); ahead of the held one it starts at 4 s
    assert short.window.start_s == pytest.approx(4.0)
    assert 2.0 + short.window.ttft_s <= 6.0
    assert set(short.moved) == {"held"} and short.moved["held"].start_s == pytest.approx(4.5)
    # the running one never moves; the held one stays within its limit
    assert max(short.moved["held"].stream_end_s, short.moved["held"].end_s) <= 20.0


def test_no_jump_past_an_earlier_due_time_a_limit_it_would_break_or_for_a_lost_cause() -> None:
    ledger = EgressLedger(lanes=1)
    ledger.reserve("running", earliest_window(ledger, 0.0, 0.0, 4.0, FAST).transfer())  # type: ignore[union-attr]
    ledger.reserve("held", earliest_window(ledger, 0.0, 0.0, 4.0, FAST).transfer())  # type: ignore[union-attr]

    def place(due: float, held: Deadline | None) -> float:
        deadlines = {"running": Deadline(9.0, 9.0)} | ({} if held is None else {"held": held})
        p = window_by_deadline(ledger, 1.0, 0.0, 0.5, FAST, due_s=due, deadlines=deadlines)
        assert p is not None
        assert (p.window.start_s < 8.0) == bool(p.moved)
        return p.window.start_s

    assert place(6.0, Deadline(5.0, 9.0)) == pytest.approx(8.0)  # the held one is due earlier: arrival order
    assert place(6.0, Deadline(8.2, 8.2)) == pytest.approx(8.0)  # moved back 0.5 s it would end at 8.5, past 8.2
    assert place(6.0, Deadline(6.0, 8.5)) == pytest.approx(8.0)  # due as early (a tie): arrival order
    assert place(6.0, Deadline(8.5, 8.5)) == pytest.approx(4.0)  # it still makes 8.5 s: the short one goes first
    assert place(4.0, Deadline(20.0, 20.0)) == pytest.approx(8.0)  # at best it ends at 4.5 s, past 4: nobody moves
    assert place(float("inf"), Deadline(20.0, 20.0)) == pytest.approx(8.0)  # no due time: arrival order
    assert place(6.0, None) == pytest.approx(8.0)  # a booking without a deadline never moves


@settings(max_examples=150, deadline=None)
@given(requests, st.integers(1, 4), st.floats(1.0, 100.0), st.lists(st.floats(0.5, 30.0), min_size=50, max_size=50))
def test_deadline_order_keeps_the_cap_the_lanes_and_every_limit(reqs, lanes, capacity, slack) -> None:  # type: ignore[no-untyped-def]
    params = LinkParams("p", capacity_gbps=capacity)
    ledger = EgressLedger(lanes=lanes, expire_s=1e9)
    deadlines: dict[str, Deadline] = {}
    now = 0.0
    for i, (dt, gbit, prefill, timing) in enumerate(sorted(reqs)):
        now = max(now, dt)
        due = now + prefill + slack[2 * i]
        p = window_by_deadline(
            ledger, now, gbytes(gbit), prefill, params, timing, due_s=due, deadlines=deadlines, pull_gbps=capacity
        )
        assert p is not None and p.window.start_s >= now - 1e-9
        for key, moved in p.moved.items():
            before = ledger.get(key)
            assert before is not None and before.start_s > now and moved.start_s > before.start_s
            ledger.reserve(key, moved)
            assert max(moved.stream_end_s, moved.end_s) <= deadlines[key].limit_s + 1e-6
        ledger.reserve(str(i), p.window.transfer())
        deadlines[str(i)] = Deadline.of(now + p.window.ttft_s, due, due + slack[2 * i + 1])
    booked = ledger.transfers(now)
    for t in booked:
        for at in (t.stream_start_s + 1e-7, (t.stream_start_s + t.stream_end_s) / 2):
            assert booked_gbps(booked, at) <= params.cap_gbps + 1e-6
    for lane in range(lanes):  # one prefill at a time on each lane
        spans = sorted((t.start_s, t.end_s) for t in booked if t.lane == lane)
        assert all(b[0] >= a[1] - 1e-6 for a, b in itertools.pairwise(spans))
