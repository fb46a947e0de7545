"""Link state: hysteresis between the watermarks, the ledger's estimate, admission under the cap."""

from __future__ import annotations

import pytest

from prfaas_core.policy.link_state import EgressLedger, LinkParams, LinkState, admit, next_link_state

LINK = LinkParams("a-to-b", capacity_gbps=100, max_utilization=0.8, scarce_watermark=0.9, abundant_watermark=0.7)


def test_watermarks_are_fractions_of_the_cap() -> None:
    assert LINK.cap_gbps == pytest.approx(80)
    assert LINK.scarce_gbps == pytest.approx(72)
    assert LINK.abundant_gbps == pytest.approx(56)


@pytest.mark.parametrize(
    ("egress", "expected"),
    [(10, "abundant"), (71.9, "abundant"), (72, "scarce"), (90, "scarce")],
)
def test_abundant_turns_scarce_only_at_the_scarce_watermark(egress: float, expected: str) -> None:
    assert next_link_state(LinkState(), egress, LINK, 1.0).mode == expected


@pytest.mark.parametrize(("egress", "expected"), [(71, "scarce"), (56.1, "scarce"), (55.9, "abundant")])
def test_scarce_returns_only_below_the_abundant_watermark(egress: float, expected: str) -> None:
    scarce = LinkState("scarce", 75, 0.0, "x")
    state = next_link_state(scarce, egress, LINK, 2.0)
    assert state.mode == expected
    if expected == "abundant":
        assert state.changed_at_s == 2.0 and "abundant watermark" in state.reason
    else:
        assert state.changed_at_s == 0.0


def test_ledger_counts_own_streams_and_corrects_a_stale_measurement() -> None:
    ledger = EgressLedger()
    ledger.start("r1", 1.25e9, now_s=0.0, duration_s=1.0)  # 10 Gbps for 1 s
    assert ledger.own_gbps(0.5) == pytest.approx(10)
    ledger.record_measurement(40.0, now_s=0.5)  # other replicas carry 30
    ledger.start("r2", 2.5e9, now_s=0.6, duration_s=1.0)  # +20 Gbps since the measurement
    assert ledger.estimate_gbps(0.7, LINK) == pytest.approx(60)
    ledger.finish("r1")
    assert ledger.estimate_gbps(0.8, LINK) == pytest.approx(50)
    # a measurement older than the max age is ignored: only own streams count
    assert ledger.estimate_gbps(10.0, LINK) == pytest.approx(20)


def test_ledger_expires_streams_never_finished() -> None:
    ledger = EgressLedger(expire_s=5.0)
    ledger.start("lost", 1e9, now_s=0.0, duration_s=1.0)
    assert ledger.in_flight == 1
    assert ledger.own_gbps(6.0) == 0.0 and ledger.in_flight == 0


def test_admission_enforces_the_cap() -> None:
    assert admit(70, 9.9, LINK).admitted
    verdict = admit(70, 10.1, LINK)
    assert not verdict.admitted and "exceed the cap 80.00" in verdict.reason


def test_bad_params_are_rejected() -> None:
    with pytest.raises(ValueError):
        LinkParams("x", capacity_gbps=10, scarce_watermark=0.5, abundant_watermark=0.6)
    with pytest.raises(ValueError):
        LinkParams("x", capacity_gbps=0)


def test_admitted_streams_bound_the_estimate_below_a_saturated_measurement() -> None:
    ledger = EgressLedger()
    for i in range(12):  # 12 x 10 Gbps admitted, the 100 Gbps link carries its capacity
        ledger.start(f"r{i}", 1.25e9, now_s=0.0, duration_s=1.0)
    ledger.record_measurement(99.0, now_s=0.1)
    assert ledger.estimate_gbps(0.2, LINK) == pytest.approx(120)


def test_without_lanes_everything_dispatched_counts_at_once() -> None:
    ledger = EgressLedger()
    for i in range(3):  # three 2 Gbps streams dispatched together; nothing says they queue
        ledger.start(f"r{i}", 0.25e9 * 4, now_s=0.0, duration_s=4.0)
    assert ledger.own_gbps(0.1) == pytest.approx(6)
    assert ledger.admission_gbps(0.1, LINK) == pytest.approx(6)


def test_lanes_schedule_queued_streams_after_the_ones_ahead() -> None:
    ledger = EgressLedger(lanes=2)
    starts = [ledger.start(f"r{i}", 1e9, now_s=0.0, duration_s=4.0).start_s for i in range(5)]
    assert starts == [0.0, 0.0, 4.0, 4.0, 8.0]  # two PrFaaS instances take them two by two
    assert ledger.own_gbps(1.0) == pytest.approx(4)  # only the two prefilling stream (2 Gbps each)
    assert ledger.own_gbps(5.0) == pytest.approx(8)  # the first two are past their end but unfinished: counted
    ledger.finish("r0")
    ledger.finish("r1")
    assert ledger.own_gbps(5.0) == pytest.approx(4)
    assert ledger.estimate_gbps(5.0, LINK) == pytest.approx(4)


def test_lane_admission_counts_the_window_the_new_stream_will_share() -> None:
    tight = LinkParams("tight", capacity_gbps=5, max_utilization=0.8)  # cap 4 Gbps
    ledger = EgressLedger(lanes=2)
    for i in range(3):  # 2 Gbps each: two stream now, the third waits for the first instance to free up
        ledger.start(f"r{i}", 1e9, now_s=0.0, duration_s=4.0)
    # counted from dispatch the link looks over the cap (6 Gbps); a newcomer would stream from t = 4 next
    # to the third only
    assert ledger.admission_gbps(0.5, tight) == pytest.approx(2)
    assert admit(ledger.admission_gbps(0.5, tight), 2.0, tight).admitted
    ledger.set_lanes(0)
    assert not admit(ledger.admission_gbps(0.5, tight), 2.0, tight).admitted


def test_lane_admission_takes_the_heaviest_stream_of_each_other_lane() -> None:
    tight = LinkParams("tight", capacity_gbps=5, max_utilization=0.8)  # cap 4 Gbps
    ledger = EgressLedger(lanes=2)
    ledger.start("long", 3e9, now_s=0.0, duration_s=8.0)  # 3 Gbps on lane 0 until t = 8
    ledger.start("short", 1e9, now_s=0.0, duration_s=4.0)  # 2 Gbps on lane 1 until t = 4
    assert ledger.admission_gbps(0.5, tight) == pytest.approx(3)  # a newcomer takes lane 1 at t = 4
    assert not admit(ledger.admission_gbps(0.5, tight), 2.0, tight).admitted
    assert admit(ledger.admission_gbps(0.5, tight), 1.0, tight).admitted


def test_unfinished_streams_past_their_window_count_until_finished() -> None:
    ledger = EgressLedger(lanes=1)
    ledger.start("slow", 1e9, now_s=0.0, duration_s=2.0)  # 4 Gbps, still pulling its KV at t = 3
    assert ledger.admission_gbps(3.0, LINK) == pytest.approx(4)
    ledger.finish("slow")
    assert ledger.admission_gbps(3.0, LINK) == 0.0


def test_lane_admission_adds_the_other_replicas_measured_egress() -> None:
    ledger = EgressLedger(lanes=2)
    ledger.start("mine", 1e9, now_s=0.0, duration_s=4.0)  # 2 Gbps on the wire
    ledger.record_measurement(12.0, now_s=0.5)  # others carry 10
    assert ledger.estimate_gbps(1.0, LINK) == pytest.approx(12)
    assert ledger.admission_gbps(1.0, LINK) == pytest.approx(12)  # the newcomer takes the free lane now
    ledger.set_lanes(0)
    assert ledger.admission_gbps(1.0, LINK) == pytest.approx(12)


def test_the_ledgers_bookings_by_key_are_its_keys_with_their_transfers_expired_ones_dropped() -> None:
    ledger = EgressLedger(expire_s=10.0, lanes=2)
    ledger.start("a", 1e9, 0.0, 1.0)
    ledger.start("b", 2e9, 0.0, 2.0)
    ledger.start("c", 3e9, 5.0, 1.0)
    booked = ledger.booked(5.0)
    assert list(booked) == ledger.keys(5.0) == ["a", "b", "c"]
    assert all(booked[k] is ledger.get(k) for k in booked)
    assert list(ledger.booked(12.5)) == ["c"]  # a and b started over 10 s ago and ended long before
    booked.clear()  # a copy: the ledger keeps its bookings
    assert ledger.keys(12.5) == ["c"]
