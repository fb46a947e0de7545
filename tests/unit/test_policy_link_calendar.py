"""The link scheduler: reservation calendar on the EgressLedger's lanes, the cap a hard ceiling."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prfaas_core.names import GBPS_BITS
from prfaas_core.policy.link_calendar import (
    booked_gbps,
    choose_window,
    earliest_window,
    max_wait_s,
)
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
