"""The short-term pipeline's two entry points: refresh (ledger -> link states -> t) and route (view ->
decision -> instance picks, breakers consulted), and the policy as a parameter."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from prfaas_core.capacity.plan_inputs import case_study_inputs
from prfaas_core.policy.breaker import BreakerBoard, BreakerParams
from prfaas_core.policy.link_state import EgressLedger, LinkParams, LinkState
from prfaas_core.policy.routing import InstancePick, InstanceView, RouteRequest
from prfaas_core.policy.short_term import (
    NO_LINK,
    PRODUCTION,
    RecentLengths,
    RefreshTick,
    RemoteSide,
    RouteTick,
    refresh,
    route,
)
from prfaas_core.policy.threshold import ThresholdBounds, ThresholdDecision

INPUTS = case_study_inputs()
KV = INPUTS.kv
PRF = INPUTS.prfaas_hardware.prefill_seconds
PD = INPUTS.pd_hardware.prefill_seconds
LINK = LinkParams("a-to-b", 100.0)
T0 = ThresholdDecision(19_400, 0, "initial")


def refresh_tick(measured: float, lengths: Sequence[int] = (), **kw: object) -> RefreshTick:
    tick = RefreshTick(
        10.0,
        {"a-to-b": LINK},
        {"a-to-b": EgressLedger()},
        {},
        ThresholdBounds(19_400),
        KV,
        lengths,
        10.0,
        T0,
        {"a-to-b": measured},
    )
    return replace(tick, **kw)  # type: ignore[arg-type]


def test_refresh_records_the_measurement_turns_scarce_and_raises_t() -> None:
    long = [60_000] * 200  # 20 req/s of 60K-token prompts: far over the budget
    done = refresh(refresh_tick(95.0, long))
    assert done.links["a-to-b"].scarce and done.changed_links == ("a-to-b",) and done.scarce
    assert done.threshold.tokens > 19_400 and "scarce" in done.threshold.reason


def test_refresh_keeps_t_when_told_not_to_decide_and_without_links_t_is_t_min() -> None:
    kept = refresh(refresh_tick(0.0, [60_000] * 200, decide_threshold=False))
    assert kept.threshold is T0 and not kept.scarce and kept.changed_links == ()
    none = refresh(refresh_tick(0.0, links={}, ledgers={}, measured_gbps=None))
    assert none.threshold == ThresholdDecision(19_400, 0, NO_LINK) and none.links == {}


def test_recent_lengths_forget_what_left_the_window() -> None:
    recent = RecentLengths()
    for t, n in ((0.0, 1), (5.0, 2), (10.0, 3)):
        recent.add(t, n)
    assert recent.within(12.0, 7.0) == [2, 3] and len(recent) == 2


def instances(*names: str, queued: float = 0.0) -> list[InstanceView]:
    return [InstanceView(n, queued_prefill_s=queued * i) for i, n in enumerate(names)]


def route_tick(total: int, **kw: object) -> RouteTick:
    tick = RouteTick(
        0.0,
        RouteRequest(total),
        19_400,
        KV,
        PRF,
        PD,
        {"a-to-b": LINK},
        {"a-to-b": LinkState()},
        {"a-to-b": EgressLedger()},
        (RemoteSide("prfaas", "a-to-b"),),
        prefill=instances("p0", "p1", queued=1.0),
        decode=instances("d0", "d1"),
    )
    return replace(tick, **kw)  # type: ignore[arg-type]


def test_route_sends_long_requests_remote_and_picks_local_instances() -> None:
    plan = route(route_tick(40_000))
    assert plan.decision.target == "remote" and plan.remote is not None and plan.remote.name == "prfaas"
    assert plan.prefill is not None and plan.prefill.name == "p0"
    assert plan.decode is not None and plan.decode.name == "d0"
    short = route(route_tick(1_000))
    assert short.decision.target == "local" and short.remote is None


def test_route_skips_a_remote_not_ready_or_whose_breaker_is_open() -> None:
    not_ready = route(route_tick(40_000, remotes=(RemoteSide("prfaas", "a-to-b", "no ready PrFaaS instance"),)))
    assert not_ready.decision.target == "local" and "no ready PrFaaS instance" in not_ready.decision.reason
    board = BreakerBoard()
    board.ensure(["prfaas"])
    params = BreakerParams(failure_threshold=1, open_s=10.0)
    board.failed("prfaas", 0.0, params, "boom")
    tick = route_tick(40_000, breakers=board, breaker_now_s=1.0, breaker_params=params)
    opened = route(tick)
    assert opened.decision.target == "local" and "breaker open" in opened.decision.reason
    probe = route(replace(tick, breaker_now_s=11.0))  # past open_s: one probe goes through
    assert probe.decision.target == "remote" and board.get("prfaas").mode == "half-open"
    assert route(replace(tick, breaker_now_s=11.5)).decision.target == "local"  # one probe at a time
    board.succeeded("prfaas")
    assert not board.is_open("prfaas")


def test_no_decode_instance_means_no_prefill_pick_and_picks_may_be_deferred() -> None:
    down = [InstanceView("d0", healthy=False)]
    plan = route(route_tick(1_000, decode=down))
    assert plan.decode is not None and plan.decode.name is None and plan.prefill is None
    deferred = route(route_tick(1_000, prefill=None, decode=None))
    assert deferred.prefill is None and deferred.decode is None


def test_a_baseline_is_a_parameter() -> None:
    def last(views: Sequence[InstanceView], total: int = 0, seconds: object = None) -> InstancePick:
        return InstancePick(views[-1].name, 0.0, "last")

    baseline = replace(PRODUCTION, pick_prefill=last, pick_decode=last)
    plan = route(route_tick(1_000), baseline)
    assert plan.prefill is not None and plan.prefill.name == "p1"
    assert plan.decode is not None and plan.decode.name == "d1"


def _opened_board(params: BreakerParams) -> BreakerBoard:
    board = BreakerBoard()
    board.ensure(["prfaas"])
    board.failed("prfaas", 0.0, params, "boom")
    return board


def test_a_short_request_past_the_open_window_takes_no_probe() -> None:
    """The stuck-open finding: short requests routed locally must leave the probe to a request that uses it."""
    params = BreakerParams(failure_threshold=1, open_s=10.0)
    board = _opened_board(params)
    for _ in range(5):
        short = route(route_tick(1_000, breakers=board, breaker_now_s=11.0, breaker_params=params))
        assert short.decision.target == "local" and short.probe is None
    assert board.get("prfaas").mode == "open" and board.get("prfaas").probes == ()
    long = route(route_tick(40_000, breakers=board, breaker_now_s=11.0, breaker_params=params))
    assert long.decision.target == "remote" and long.probe == 11.0
    board.succeeded("prfaas")
    assert board.get("prfaas").mode == "closed"


def test_no_decode_instance_takes_no_probe() -> None:
    params = BreakerParams(failure_threshold=1, open_s=10.0)
    board = _opened_board(params)
    down = [InstanceView("d0", healthy=False)]
    plan = route(route_tick(40_000, decode=down, breakers=board, breaker_now_s=11.0, breaker_params=params))
    assert plan.remote is None and plan.probe is None and board.get("prfaas").mode == "open"


def test_no_local_prefill_instance_sends_even_a_short_request_remote() -> None:
    """The misleading-503 finding: every local prefill instance draining must not reject what the remote can do."""
    draining = [InstanceView("p0", draining=True)]
    plan = route(route_tick(1_000, prefill=draining))
    assert plan.decision.target == "remote" and plan.decision.kind == "no-local-prefill"
    assert plan.remote is not None and plan.decode is not None and plan.decode.name == "d0"
    assert "no healthy, non-draining prefill instance" in plan.decision.reason


def test_a_scheduled_link_sends_what_the_ledger_declines_to_the_gateways_calendar() -> None:
    """The router's ledger sees only its own streams: where the gateway books the link (``scheduled``) a long
    request the ledger would decline is sent to the gateway (which reserves a window or declines); elsewhere the
    ledger's verdict stands, and short requests stay local either way."""
    tight = LinkParams("a-to-b", 5.0)
    busy = EgressLedger()
    busy.start("other", 4e9, 0.0, 10.0, max_gbps=tight.cap_gbps)  # 3.2 Gbps of the 4-Gbps cap streaming
    kw = {"links": {"a-to-b": tight}, "ledgers": {"a-to-b": busy}}
    declined = route(route_tick(60_000, **kw))
    assert declined.decision.target == "local" and declined.decision.kind == "admission"
    assert declined.remote is None
    scheduled = (RemoteSide("prfaas", "a-to-b", scheduled=True),)
    asked = route(route_tick(60_000, remotes=scheduled, **kw))
    assert asked.decision.target == "remote" and asked.remote is not None and asked.remote.name == "prfaas"
    assert asked.decision.kind == "threshold" and "the gateway's link calendar decides" in asked.decision.reason
    assert "would exceed the cap" in asked.decision.reason
    assert asked.decision.transfer_bytes > 0
    short = route(route_tick(1_000, remotes=scheduled, **kw))
    assert short.decision.target == "local" and short.decision.kind == "threshold"
    unready = route(route_tick(60_000, remotes=(RemoteSide("prfaas", "a-to-b", "down", scheduled=True),), **kw))
    assert unready.decision.target == "local" and unready.decision.kind == "unavailable"


def test_a_scheduled_links_state_follows_the_wire_not_the_ledger() -> None:
    """Streams the router dispatched but the gateway holds for later windows make its ledger read far above
    the wire; where the gateway schedules the link, its state is the measured egress."""
    ledger = EgressLedger()
    for k in range(3):  # three 40-Gbps streams dispatched: 120 Gbps by the ledger's count
        ledger.start(f"s{k}", 50e9, 10.0, 10.0)
    busy = refresh(refresh_tick(30.0, ledgers={"a-to-b": ledger}))
    assert busy.links["a-to-b"].scarce
    wire = refresh(refresh_tick(30.0, ledgers={"a-to-b": ledger}, scheduled=frozenset({"a-to-b"})))
    assert not wire.links["a-to-b"].scarce and wire.links["a-to-b"].egress_gbps == 30.0
