"""The link's admission is one pure function (prfaas_core.policy.link_admission.admit) that the real gateway and
the simulator's gateway both call: a spy on it sees both; each decline rule answers from the core alone."""

from __future__ import annotations

import math

import pytest

from prfaas_core.api import GatewayAdmission, RouterLink
from prfaas_core.names import GBPS_BITS
from prfaas_core.policy import link_admission
from prfaas_core.policy.link_admission import AdmitTick, Booking, Decline, WireTick, admit, book, wire_turn
from prfaas_core.policy.link_state import EgressLedger, LinkParams
from prfaas_core.sim import gateway as sim_gateway
from prfaas_router.gateway import admission as real_gateway
from prfaas_router.gateway import pulls as real_pulls

LINK = RouterLink(name="a-to-b", capacity_gbps=10.0)  # cap 8 Gbps
PARAMS = LinkParams("a-to-b", 10.0, 0.8, 0.6, 0.3)
GBIT = GBPS_BITS / 8.0  # bytes per Gbit


def test_the_gateway_and_the_simulator_call_the_same_admission(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def spy(who: str):  # type: ignore[no-untyped-def]
        def wrapped(ledger, deadlines, tick):  # type: ignore[no-untyped-def]
            calls.append(who)
            return link_admission.admit(ledger, deadlines, tick)

        return wrapped

    assert real_gateway.admit is link_admission.admit and sim_gateway.admit is link_admission.admit
    monkeypatch.setattr(real_gateway, "admit", spy("gateway"))
    monkeypatch.setattr(sim_gateway, "admit", spy("simulator"))
    spec = GatewayAdmission.model_validate({"link": "a-to-b", "replicas": 1, "streamTiming": "layer-wise"})
    real = real_gateway.LinkAdmission(spec, LINK, time_scale=1.0)
    got = real.decide("r", {}, 8 * GBIT, 1.0, 0.0)
    sim = sim_gateway.SimGateway(lanes=0, timing="layer-wise")
    _, booked = sim.ask(0.0, 8 * GBIT, 1.0, PARAMS, local_ttft_s=10.0, slo_ttft_s=5.0)
    assert calls == ["gateway", "simulator"]
    # the same calendar, the same request: the same window
    assert isinstance(got, real_pulls.Booking) and booked is not None
    assert got.window == booked.window


def _ledger(lanes: int = 1) -> EgressLedger:
    return EgressLedger(lanes=lanes, expire_s=1e9)


def _tick(**kw: object) -> AdmitTick:
    base: dict[str, object] = {"now_s": 0.0, "nbytes": 8 * GBIT, "prefill_s": 1.0, "params": PARAMS}
    return AdmitTick(**(base | kw))  # type: ignore[arg-type]


def _book(ledger: EgressLedger, deadlines: dict, key: str, **kw: object) -> Booking:  # type: ignore[type-arg]
    answer = admit(ledger, deadlines, _tick(**kw))
    assert isinstance(answer, Booking), answer
    book(ledger, deadlines, key, answer)
    return answer


def test_each_decline_rule() -> None:
    ledger, deadlines = _ledger(), {}
    first = _book(ledger, deadlines, "a", slo_ttft_s=10.0)
    assert first.window.wait_s == 0.0 and "a" in deadlines
    # the lane is busy for 1 s: a caller accepting no wait is declined with the earliest start
    late = admit(ledger, deadlines, _tick(max_wait_s=0.0))
    assert isinstance(late, Decline) and late.reason == "link_window" and late.window is not None
    assert late.window.wait_s == pytest.approx(1.0)
    # a waiting window whose predicted TTFT passes what the caller accepts
    slow = admit(ledger, deadlines, _tick(max_ttft_s=1.5))
    assert isinstance(slow, Decline) and slow.reason == "link_window" and "predicted TTFT" in slow.message
    # too many already wait
    full = admit(ledger, deadlines, _tick(waiting=3, max_waiting=3))
    assert isinstance(full, Decline) and full.reason == "overloaded"
    # a zero ceiling: the other replicas' measured egress fills the cap
    crowded = _ledger()
    crowded.record_measurement(9.0, 0.0)
    zero = admit(crowded, {}, _tick())
    assert isinstance(zero, Decline) and zero.reason == "overloaded" and zero.window is None


def test_through_the_instances_declines_a_window_that_starts_now() -> None:
    ledger = _ledger(lanes=0)  # no lanes: the window starts now
    ok = admit(ledger, {}, _tick(max_ttft_s=3.0, ready_s=1.5))
    assert isinstance(ok, Booking) and ok.predicted_ttft_s == pytest.approx(1.5)  # the stream can start 0.5 s late
    behind = admit(ledger, {}, _tick(max_ttft_s=3.0, ready_s=4.0))
    assert isinstance(behind, Decline) and "instances" in behind.message
    assert behind.window is not None and behind.window.ttft_s == pytest.approx(4.0)


def test_the_lane_order() -> None:
    """A request due sooner goes ahead of a held booking due later (deadline); first booked first served
    (arrival)."""
    for order, ahead in (("deadline", True), ("arrival", False)):
        ledger: EgressLedger = _ledger()
        deadlines: dict = {}  # type: ignore[type-arg]
        _book(ledger, deadlines, "running", slo_ttft_s=30.0, lane_order=order)
        held = _book(ledger, deadlines, "held", slo_ttft_s=30.0, max_ttft_s=30.0, lane_order=order)
        assert held.window.wait_s == pytest.approx(1.0)
        urgent = admit(ledger, deadlines, _tick(nbytes=0.0, slo_ttft_s=2.5, lane_order=order))
        assert isinstance(urgent, Booking)
        assert (urgent.window.wait_s == pytest.approx(1.0)) is ahead
        assert bool(urgent.moved) is ahead
        assert (urgent.deadline is not None) is (order == "deadline")
    with pytest.raises(ValueError, match="lane_order"):
        admit(_ledger(), {}, _tick(lane_order="random"))


@pytest.mark.parametrize(
    ("tick", "turn"),
    [
        (WireTick(instance_full=True, older_peer_first=False, missing=0.0, oldest_here=True), "wait"),
        (WireTick(instance_full=False, older_peer_first=True, missing=0.0, oldest_here=True), "wait"),
        (WireTick(instance_full=False, older_peer_first=False, missing=0.0, oldest_here=False), "go"),
        (WireTick(instance_full=False, older_peer_first=False, missing=0.2, oldest_here=True), "borrow"),
        (WireTick(instance_full=False, older_peer_first=False, missing=0.2, oldest_here=False), "wait"),
    ],
)
def test_the_wire_turn(tick: WireTick, turn: str) -> None:
    assert wire_turn(tick) == turn


def test_no_limits_no_decline() -> None:
    ledger = _ledger()
    for i in range(5):
        answer = admit(ledger, {}, _tick())
        assert isinstance(answer, Booking) and math.isfinite(answer.predicted_ttft_s)
        book(ledger, {}, str(i), answer)
