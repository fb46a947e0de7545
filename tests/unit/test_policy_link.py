"""Link state: hysteresis between the watermarks, the ledger's estimate, admission under the cap."""

from __future__ import annotations

import pytest

from prfaas_core.policy.link import EgressLedger, LinkParams, LinkState, admit, next_link_state

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
