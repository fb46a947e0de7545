"""The gateway's admission (prfaas_router.gateway.admission): two replicas each book cap / 2, so together they never
pass the cap; a window later than the caller accepts is a 429 decline; bad headers are a 400."""

from __future__ import annotations

import asyncio
import json
import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prfaas_core import names
from prfaas_core.api import AdmissionDecline, GatewayAdmission, RouterLink
from prfaas_core.names import GBPS_BITS
from prfaas_core.policy.link_admission import Verified
from prfaas_core.policy.link_calendar import booked_gbps
from prfaas_router.gateway.admission import LinkAdmission
from prfaas_router.gateway.pulls import Booking
from prfaas_router.state.metrics import RouterMetrics

LINK = RouterLink(name="a-to-b", capacity_gbps=10.0)  # cap 8 Gbps


def replica(n: int = 2, timing: str = "pull-after-prefill") -> LinkAdmission:
    spec = GatewayAdmission.model_validate({"link": "a-to-b", "replicas": n, "streamTiming": timing})
    return LinkAdmission(spec, LINK, time_scale=1.0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.floats(0.0, 10.0), st.floats(0.1, 30.0), st.floats(0.1, 5.0)),
        min_size=1,
        max_size=30,
    ),
    st.sampled_from(["pull-after-prefill", "layer-wise"]),
)
def test_two_replicas_never_book_past_the_cap_together(reqs, timing) -> None:  # type: ignore[no-untyped-def]
    a, b = replica(2, timing), replica(2, timing)
    now = 0.0
    for i, (on_a, dt, gbit, prefill) in enumerate(sorted(reqs, key=lambda r: r[1])):
        now = max(now, dt)
        got = (a if on_a else b).decide(str(i), {}, gbit * GBPS_BITS / 8.0, prefill, now)
        assert isinstance(got, Booking)
    instants = [t.stream_start_s + 1e-7 for adm in (a, b) for t in adm.ledger.transfers(now)]
    for at in instants:
        total = booked_gbps(a.ledger.transfers(now), at) + booked_gbps(b.ledger.transfers(now), at)
        assert total <= LINK.capacity_gbps * LINK.max_utilization + 1e-6


def test_a_window_later_than_accepted_is_declined_with_its_start() -> None:
    adm = replica(1)
    nbytes = 8.0 * GBPS_BITS / 8.0  # 8 Gbit: 1 s at the 8 Gbps cap
    first = adm.decide("a", {}, nbytes, 1.0, 0.0)
    assert isinstance(first, Booking) and first.window.wait_s == 0.0
    resp = adm.decide("b", {names.HEADER_MAX_WAIT_MS: "0"}, nbytes, 1.0, 0.0)
    assert not isinstance(resp, Booking)
    assert resp.status == 429 and int(resp.headers["Retry-After"]) >= 1
    assert resp.body is not None
    decline = AdmissionDecline.model_validate(json.loads(bytes(resp.body)))  # type: ignore[arg-type]
    assert decline.reason == "link_window"
    assert decline.earliest_start_ms is not None and decline.earliest_start_ms > 0
    ok = adm.decide("c", {names.HEADER_MAX_WAIT_MS: str(decline.earliest_start_ms + 1)}, nbytes, 1.0, 0.0)
    assert isinstance(ok, Booking) and ok.window.wait_s * 1000 <= decline.earliest_start_ms + 1


def test_the_caller_bounds_the_predicted_ttft_which_only_the_calendar_knows() -> None:
    """Pull-after-prefill: the TTFT through a window is its wait + the prefill + the pull. A caller that bounds
    the TTFT gets a decline where the wait alone would pass; a window that starts now is always taken."""
    adm = replica(1)
    nbytes = 8.0 * GBPS_BITS / 8.0  # 8 Gbit: 1 s at the 8 Gbps cap, after a 1-s prefill
    first = adm.decide("a", {names.HEADER_MAX_TTFT_MS: "100"}, nbytes, 1.0, 0.0)
    assert isinstance(first, Booking) and first.window.wait_s == 0.0 and first.window.ttft_s > 0.1
    # the second pull waits for the first (1 s): its TTFT is 1 + 1 + 1 = 3 s
    ttft_ok = {names.HEADER_MAX_WAIT_MS: "1500", names.HEADER_MAX_TTFT_MS: "3000"}
    too_late = {names.HEADER_MAX_WAIT_MS: "1500", names.HEADER_MAX_TTFT_MS: "2500"}
    resp = adm.decide("b", too_late, nbytes, 1.0, 0.0)
    assert not isinstance(resp, Booking) and resp.status == 429
    decline = AdmissionDecline.model_validate(json.loads(bytes(resp.body)))  # type: ignore[arg-type]
    assert decline.reason == "link_window" and decline.predicted_ttft_ms is not None
    assert decline.predicted_ttft_ms > 2500 and "predicted TTFT" in decline.message
    ok = adm.decide("c", ttft_ok, nbytes, 1.0, 0.0)
    assert isinstance(ok, Booking) and abs(ok.window.ttft_s - 3.0) < 1e-6


def test_a_window_now_behind_busy_instances_is_declined_past_the_callers_ttft() -> None:
    """The calendar's window starts now (an idle link), but the instances, as the gateway sees them, finish the
    prefill only 4 s from now (``ready_s``): the TTFT through them (4 s + the 1-s pull) passes the caller's 3 s, so
    the answer is a decline with that TTFT and its start, and nothing is booked; a caller that accepts 5.5 s, a
    caller with no TTFT bound and instances ready before the window are booked as before."""
    adm = replica(1)
    nbytes = 8.0 * GBPS_BITS / 8.0  # 8 Gbit: 1 s at the 8 Gbps cap, after a 1-s prefill
    bound = {names.HEADER_MAX_TTFT_MS: "3000"}
    resp = adm.decide("a", bound, nbytes, 1.0, 0.0, ready_s=4.0)
    assert not isinstance(resp, Booking) and resp.status == 429 and adm.ledger.get("a") is None
    decline = AdmissionDecline.model_validate(json.loads(bytes(resp.body)))  # type: ignore[arg-type]
    assert decline.reason == "link_window" and "queues and egress" in decline.message
    assert decline.predicted_ttft_ms == pytest.approx(5000.0) and decline.earliest_start_ms == pytest.approx(3000.0)
    ok = adm.decide("b", {names.HEADER_MAX_TTFT_MS: "5500"}, nbytes, 1.0, 0.0, ready_s=4.0)
    assert isinstance(ok, Booking) and ok.window.wait_s == 0.0
    assert isinstance(adm.decide("c", {}, nbytes, 1.0, 0.0, ready_s=4.0), Booking)
    fresh = replica(1)
    assert isinstance(fresh.decide("d", bound, nbytes, 1.0, 0.0, ready_s=0.5), Booking)


def test_bad_headers_are_400_naming_them() -> None:
    adm = replica(1)
    bad = (
        {names.HEADER_KV_BYTES: "x"},
        {names.HEADER_MAX_WAIT_MS: "-1"},
        {names.HEADER_MAX_TTFT_MS: "soon"},
        {names.HEADER_LINK: "other"},
    )
    for headers in bad:
        resp = adm.decide("k", headers, 1.0, 1.0, 0.0)
        assert not isinstance(resp, Booking) and resp.status == 400
        assert resp.body is not None and "x-prfaas" in bytes(resp.body).decode()  # type: ignore[arg-type]


def test_a_router_report_of_available_bandwidth_bounds_the_calendar_until_it_goes_stale() -> None:
    from prfaas_router.gateway.pulls import REPORT_MAX_AGE_S
    from prfaas_router.state.metrics import RouterMetrics

    spec = GatewayAdmission.model_validate({"link": "a-to-b", "replicas": 2})
    metrics = RouterMetrics()
    adm = LinkAdmission(spec, LINK, time_scale=1.0, metrics=metrics)
    gbit = GBPS_BITS / 8.0
    # the link (10 Gbps) reported at 1 Gbps: this replica books under half of it (cap 0.4 Gbps)
    got = adm.decide("a", {names.HEADER_LINK_AVAILABLE_GBPS: "1.0"}, 4 * gbit, 1.0, 0.0)
    assert isinstance(got, Booking)
    assert got.window.rate_gbps <= 0.4 + 1e-9
    assert adm.available(1.0).gbps == 0.5
    refused = adm.decide("b", {names.HEADER_MAX_WAIT_MS: "0"}, 4 * gbit, 1.0, 0.5)
    assert not isinstance(refused, Booking) and refused.status == 429
    assert adm.available(REPORT_MAX_AGE_S + 1.0).gbps is None  # stale: the configured capacity stands
    text = metrics_text(metrics)
    assert 'prfaas_gateway_admissions_total{link="a-to-b",result="booked"} 1.0' in text
    assert 'prfaas_gateway_admissions_total{link="a-to-b",result="link_window"} 1.0' in text
    assert 'prfaas_gateway_link_available_gbps{link="a-to-b",source="reported"}' in text


def metrics_text(metrics) -> str:  # type: ignore[no-untyped-def]
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry).decode()


def test_the_router_waits_when_the_remote_fits_the_slo_and_local_does_not() -> None:
    from prfaas_router.path.prefill import resubmit_wait_s

    decline = AdmissionDecline.model_validate(
        {"reason": "link_window", "earliestStartMs": 2000, "predictedTtftMs": 5000, "link": "a-to-b", "message": ""}
    )
    # remote 5 s fits an 8-s SLO, local 12 s does not: wait (with the slack for other routers' bookings)
    assert resubmit_wait_s(decline, 12.0, 8.0) is not None
    # remote 5 s misses a 4-s SLO that an idle local (3 s) fits: go local
    assert resubmit_wait_s(decline, 3.0, 4.0, local_wait_s=0.0) is None
    # ...but not when the local prefill instances are busy: a long prefill there would delay the queue behind it
    assert resubmit_wait_s(decline, 3.0, 4.0, local_wait_s=1.0) is not None
    # without an SLO, by predicted TTFT
    assert resubmit_wait_s(decline, 3.0) is None and resubmit_wait_s(decline, 6.0) is not None


def _pulls(time_scale: float = 1.0) -> LinkAdmission:
    """One replica on the 8-Gbps cap whose pulls run at 5 Gbps: one pull on the wire at a time."""
    spec = GatewayAdmission.model_validate({"link": "a-to-b", "pullGbps": 5.0})
    return LinkAdmission(spec, LINK, time_scale=time_scale, metrics=RouterMetrics())


def test_an_answer_is_held_until_its_pull_fits_next_to_the_pulls_on_the_wire() -> None:
    """The calendar planned the second pull after the first; the first started late and still runs, so the second's
    answer waits for the first's report, not for its planned time."""

    async def main() -> None:
        adm, now = _pulls(), [0.0]
        nbytes = 5.0 * GBPS_BITS / 8.0  # 1 s at 5 Gbps
        a = adm.decide("a", {}, nbytes, 1.0, 0.0)
        b = adm.decide("b", {}, nbytes, 1.0, 0.0)
        assert isinstance(a, Booking) and isinstance(b, Booking)
        assert b.window.stream_start_s >= a.window.stream_end_s  # planned one after the other
        now[0] = 5.0  # both prefills answered late, past b's planned window
        assert await adm.release(a, True, lambda: now[0]) == "a"
        held = asyncio.create_task(adm.release(b, True, lambda: now[0]))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not held.done() and adm.holding == 1 and adm.on_wire_gbps() == 5.0
        now[0] = 6.5
        assert adm.pulled("a") and not adm.pulled("a")  # once
        assert await asyncio.wait_for(held, 5.0) == "b"
        assert adm.on_wire_gbps() == 5.0 and adm.ledger.get("a") is None and adm.ledger.get("b") is not None
        hold = adm.metrics.gateway_pull_hold.labels("a-to-b")  # type: ignore[union-attr]
        assert hold._sum.get() == 1.5  # held from 5.0 to 6.5 (model s)
        assert adm.metrics.gateway_pulls.labels("a-to-b", "reported")._value.get() == 1  # type: ignore[union-attr]

    asyncio.run(main())


def test_with_paced_instances_a_pull_waits_for_its_own_instance_and_another_instances_pull_goes_first() -> None:
    """instanceGbps: each PrFaaS instance's egress is paced to 4 Gbps, two pulls fit the 8-Gbps cap. Two answers of
    one instance would share its 4 Gbps and leave half the cap idle: the second waits for the first's report while
    the other instance's answer goes onto the wire at once."""

    async def main() -> None:
        spec = GatewayAdmission.model_validate({"link": "a-to-b", "pullGbps": 4.0, "instanceGbps": 4.0})
        adm, now = LinkAdmission(spec, LINK, time_scale=1.0, metrics=RouterMetrics()), [0.0]
        nbytes = 4.0 * GBPS_BITS / 8.0  # 1 s at 4 Gbps
        a, b, c = (adm.decide(k, {}, nbytes, 1.0, 0.0) for k in "abc")
        assert isinstance(a, Booking) and isinstance(b, Booking) and isinstance(c, Booking)
        now[0] = 1.0
        assert await adm.release(a, True, lambda: now[0], "prfaas-0") == "a"
        held = asyncio.create_task(adm.release(b, True, lambda: now[0], "prfaas-0"))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not held.done() and adm.holding == 1  # the cap has room, prfaas-0's paced egress has not
        assert await asyncio.wait_for(adm.release(c, True, lambda: now[0], "prfaas-1"), 5.0) == "c"
        assert adm.on_wire_gbps() == 8.0 and not held.done()
        now[0] = 2.5
        assert adm.pulled("a")
        assert await asyncio.wait_for(held, 5.0) == "b"
        assert adm.on_wire_gbps() == 8.0
        # without instanceGbps the same answers add up whichever instance served them: b goes next to a
        unpaced = GatewayAdmission.model_validate({"link": "a-to-b", "pullGbps": 4.0})
        plain = LinkAdmission(unpaced, LINK, time_scale=1.0, metrics=RouterMetrics())
        d, e = (plain.decide(k, {}, nbytes, 1.0, 0.0) for k in "de")
        assert isinstance(d, Booking) and isinstance(e, Booking)
        assert await plain.release(d, True, lambda: 1.0, "prfaas-0") == "d"
        assert await asyncio.wait_for(plain.release(e, True, lambda: 1.0, "prfaas-0"), 5.0) == "e"

    asyncio.run(main())


def test_with_paced_instances_an_instances_egress_work_counts_its_pulls_from_prefill_to_leaving_the_wire() -> None:
    """egress_wait_s: what a new pull on an instance waits for its paced egress (4 Gbps here). A prefill's pull counts
    from its assignment (its prefill), then drains at the paced rate once on the wire, and leaves with it; a retry
    moves it to the next instance; a failed prefill drops it. Without instanceGbps nothing counts."""

    async def main() -> None:
        spec = GatewayAdmission.model_validate({"link": "a-to-b", "pullGbps": 4.0, "instanceGbps": 4.0})
        adm, now = LinkAdmission(spec, LINK, time_scale=1.0, metrics=RouterMetrics()), [0.0]
        nbytes = 8.0 * GBPS_BITS / 8.0  # 2 s at 4 Gbps
        a, b, c = (adm.decide(k, {}, nbytes, 1.0, 0.0) for k in "abc")
        assert isinstance(a, Booking) and isinstance(b, Booking) and isinstance(c, Booking)
        assert adm.egress_wait_s("prfaas-0", 0.0) == 0.0
        adm.assign("a", "prfaas-0", a.window.bytes)
        adm.assign("b", "prfaas-1", b.window.bytes)
        adm.assign("b", "prfaas-0", b.window.bytes)  # b's prefill failed on prfaas-1: retried on prfaas-0
        assert adm.egress_wait_s("prfaas-0", 0.0) == pytest.approx(4.0)
        assert adm.egress_wait_s("prfaas-1", 0.0) == 0.0
        now[0] = 1.0
        assert await adm.release(a, True, lambda: now[0], "prfaas-0") == "a"
        assert adm.egress_wait_s("prfaas-0", 1.5) == pytest.approx(3.5)  # a drains on the wire, b waits whole
        assert adm.egress_wait_s("prfaas-0", 9.0) == pytest.approx(2.0)  # a drained; b still to come
        now[0] = 3.0
        assert adm.pulled("a")
        assert await adm.release(b, False, lambda: now[0], "prfaas-0") is None  # b's prefill failed: no pull
        assert adm.egress_wait_s("prfaas-0", 3.0) == 0.0
        adm.assign("c", "prfaas-1", c.window.bytes)
        assert await adm.release(c, True, lambda: now[0], "prfaas-1") == "c"
        assert adm.pulled("c") and adm.egress_wait_s("prfaas-1", 9.0) == 0.0
        unpaced = LinkAdmission(GatewayAdmission.model_validate({"link": "a-to-b", "pullGbps": 4.0}), LINK, 1.0)
        d = unpaced.decide("d", {}, nbytes, 1.0, 0.0)
        assert isinstance(d, Booking)
        unpaced.assign("d", "prfaas-0", d.window.bytes)
        assert unpaced.egress_wait_s("prfaas-0", 0.0) == 0.0

    asyncio.run(main())


def test_an_unreported_pull_leaves_the_wire_when_its_lease_runs_out(monkeypatch: pytest.MonkeyPatch) -> None:
    from prfaas_router.gateway import pulls as admission

    monkeypatch.setattr(admission, "LEASE_GRACE_WALL_S", 0.0)

    async def main() -> None:
        adm = _pulls(time_scale=1000.0)  # the lease (3 x 1 s + 2 s model, no wall grace) is 5 ms of wall time
        a = adm.decide("a", {}, 5.0 * GBPS_BITS / 8.0, 1.0, 0.0)
        assert isinstance(a, Booking)
        assert await adm.release(a, True, lambda: 1.0) == "a"
        assert adm.on_wire_gbps() == 5.0
        for _ in range(200):
            if not adm.on_wire_gbps():
                break
            await asyncio.sleep(0.01)
        assert adm.on_wire_gbps() == 0.0 and adm.ledger.get("a") is None and not adm.pulled("a")
        assert adm.metrics.gateway_pulls.labels("a-to-b", "lease")._value.get() == 1  # type: ignore[union-attr]

    asyncio.run(main())


def test_a_caller_gone_while_held_frees_its_booking_and_a_failed_prefill_books_nothing() -> None:
    async def main() -> None:
        adm = _pulls()
        nbytes = 5.0 * GBPS_BITS / 8.0
        a, b, c = (adm.decide(k, {}, nbytes, 1.0, 0.0) for k in "abc")
        assert isinstance(a, Booking) and isinstance(b, Booking) and isinstance(c, Booking)
        await adm.release(a, True, lambda: 1.0)
        held = asyncio.create_task(adm.release(b, True, lambda: 1.0))
        await asyncio.sleep(0)
        held.cancel()
        with pytest.raises(asyncio.CancelledError):
            await held
        assert adm.ledger.get("b") is None and adm.holding == 0
        assert await adm.release(c, False, lambda: 1.0) is None and adm.ledger.get("c") is None
        assert adm.on_wire_gbps() == 5.0  # only a

    asyncio.run(main())


def test_an_answer_held_past_most_of_the_kv_lease_is_declined_and_frees_its_window() -> None:
    """The pull on the wire is never reported; the next answer waits for it until 80 % of the engine's KV lease has
    passed (wall time), then the gateway answers 429 kv_lease: a decode sent later would find the KV freed. The
    router prefills locally on that decline (it is not a link_window to wait for)."""
    from prfaas_router.gateway.pulls import KV_LEASE_USE, KvLeaseOver
    from prfaas_router.path.prefill import resubmit_wait_s

    async def main() -> None:
        spec = GatewayAdmission.model_validate({"link": "a-to-b", "pullGbps": 5.0, "kvLeaseSeconds": 0.25})
        adm = LinkAdmission(spec, LINK, time_scale=1.0, metrics=RouterMetrics())
        nbytes = 5.0 * GBPS_BITS / 8.0  # 1 s at 5 Gbps: one pull on the wire at a time
        a, b = adm.decide("a", {}, nbytes, 1.0, 0.0), adm.decide("b", {}, nbytes, 1.0, 0.0)
        assert isinstance(a, Booking) and isinstance(b, Booking)
        now = [1.0]
        assert await adm.release(a, True, lambda: now[0]) == "a"
        held = asyncio.create_task(adm.release(b, True, lambda: now[0]))
        await asyncio.sleep(0.25 * KV_LEASE_USE / 2)
        assert not held.done() and adm.holding == 1  # still within the lease
        with pytest.raises(KvLeaseOver) as over:
            await asyncio.wait_for(held, 5.0)
        assert over.value.held_s >= 0.25 * KV_LEASE_USE
        assert adm.holding == 0 and adm.ledger.get("b") is None and adm.on_wire_gbps() == 5.0  # only a
        resp = adm.lease_answer(over.value)
        assert resp.status == 429 and resp.body is not None
        decline = AdmissionDecline.model_validate(json.loads(bytes(resp.body)))  # type: ignore[arg-type]
        assert decline.reason == "kv_lease" and decline.link == "a-to-b" and "KV lease" in decline.message
        assert adm.metrics.gateway_admissions.labels("a-to-b", "kv_lease")._value.get() == 1  # type: ignore[union-attr]
        assert resubmit_wait_s(decline, 30.0, 60.0, local_wait_s=5.0) is None  # local, whatever local's queue
        # the wire is free again once a is reported (past its bytes' time at 5 Gbps): the next answer goes at once
        now[0] = 10.0
        assert adm.pulled("a") and adm.on_wire_gbps() == 0.0
        c = adm.decide("c", {}, nbytes, 1.0, now[0])
        assert isinstance(c, Booking) and await adm.release(c, True, lambda: now[0]) == "c"

    asyncio.run(main())


def test_the_kv_lease_must_be_positive() -> None:
    with pytest.raises(ValueError, match="kvLeaseSeconds"):
        GatewayAdmission.model_validate({"link": "a-to-b", "kvLeaseSeconds": 0})


def test_held_prefills_go_earliest_due_first_and_a_moved_hold_follows_its_new_start() -> None:
    """``laneOrder: deadline``: a short request due soon takes the lane ahead of a held long one that still makes its
    own objective; the long one's hold follows its new start; ``arrival`` keeps first booked, first served."""

    def lanes(order: str) -> LinkAdmission:
        spec = GatewayAdmission.model_validate({"link": "a-to-b", "laneOrder": order})
        adm = LinkAdmission(spec, RouterLink(name="a-to-b", capacity_gbps=100.0), 1.0, RouterMetrics())
        adm.set_lanes(1)
        return adm

    def slo(ms: float) -> dict[str, str]:
        return {names.HEADER_SLO_TTFT_MS: str(ms), names.HEADER_MAX_TTFT_MS: str(ms)}

    for order in ("deadline", "arrival"):
        adm = lanes(order)
        running = adm.decide("running", slo(10_000), 0.0, 4.0, 0.0)
        held = adm.decide("held", slo(20_000), 0.0, 4.0, 1.0)  # due at 21 s, starts at 4 s in arrival order
        assert isinstance(running, Booking) and isinstance(held, Booking) and held.window.start_s == 4.0
        short = adm.decide("short", slo(4_000), 0.0, 0.5, 2.0)  # due at 6 s: only ahead of the held one
        if order == "deadline":
            assert isinstance(short, Booking) and short.window.start_s == pytest.approx(4.0)
        else:  # behind the held one it would start at 8 s: past what its caller accepts, declined at once
            assert not isinstance(short, Booking) and short.status == 429
        moved = adm.ledger.get("held")
        assert moved is not None and moved.start_s == pytest.approx(4.5 if order == "deadline" else 4.0)
        reorders = adm.metrics.registry.get_sample_value(  # type: ignore[union-attr]
            names.METRIC_GATEWAY_LANE_REORDERS, {"link": "a-to-b"}
        )
        assert (reorders or 0.0) == (1.0 if order == "deadline" else 0.0)

    # the moved hold re-reads its start: booked to start at 4 s, moved to 4.5 s, it is held until then
    adm = lanes("deadline")
    adm.time_scale = 100.0  # model seconds pass 100x faster than wall seconds
    wall0 = time.perf_counter()

    def clock() -> float:
        return (time.perf_counter() - wall0) * 100.0

    adm.decide("running", slo(10_000), 0.0, 4.0, clock())
    held = adm.decide("held", slo(20_000), 0.0, 4.0, clock())
    assert isinstance(held, Booking) and held.window.start_s < 4.5
    assert isinstance(adm.decide("short", slo(5_000), 0.0, 0.5, clock()), Booking)
    moved = adm.ledger.get("held")
    assert moved is not None and moved.start_s > held.window.start_s
    asyncio.run(adm.hold(held, clock))
    assert clock() >= moved.start_s


def test_a_routers_claims_are_verified_against_the_gateways_own_count() -> None:
    """Issue 39 item 6: a claim of 0 KV bytes (once: no pull accounting) is corrected to the gateway's count, a TTFT
    objective tighter than the configured SLO raised to it, a decode-cached claim past the prompt given no credit;
    claims within the tolerance (or looser objectives) stand."""
    from prfaas_core.policy.link_admission import CLAIM_TOLERANCE, verify_claims, verify_decode_cached

    own = 1e9
    assert verify_claims(0.0, own, math.inf, None) == Verified(own, math.inf, ("kv_bytes",))
    assert verify_claims(1e12, own, math.inf, None).corrected == ("kv_bytes",)
    assert verify_claims(own * (1 - CLAIM_TOLERANCE / 2), own, 5.0, 4.0) == Verified(own * 0.95, 5.0)
    assert verify_claims(own, own, 0.001, 4.0) == Verified(own, 4.0, ("slo_ttft",))
    assert verify_claims(own, own, 0.001, None).corrected == ()  # no SLO configured: nothing to bound it by
    assert verify_decode_cached(1_000_000, 40_000) == (0, True)
    assert verify_decode_cached(40_000, 40_000) == (0, True)
    assert verify_decode_cached(39_999, 40_000) == (39_999, False)
    assert verify_decode_cached(0, 0) == (0, False)


def test_the_gateway_books_its_own_count_when_a_claim_is_off_and_counts_it() -> None:
    """Through the gateway's admission: ``x-prfaas-kv-bytes: 0`` books the gateway's own count (a window with bytes,
    so its pull is held and counted on the wire), counted as a corrected ``kv_bytes`` claim."""

    async def main() -> None:
        spec = GatewayAdmission.model_validate({"link": "a-to-b", "pullGbps": 5.0})
        adm = LinkAdmission(spec, LINK, time_scale=1.0, metrics=RouterMetrics())
        nbytes = 5.0 * GBPS_BITS / 8.0
        b = adm.decide("a", {names.HEADER_KV_BYTES: "0"}, nbytes, 1.0, 0.0)
        assert isinstance(b, Booking) and b.window.bytes == nbytes
        assert await adm.release(b, True, lambda: 1.0) == "a"  # a pull id: it counts on the wire
        assert adm.metrics.gateway_claims_corrected.labels("a-to-b", "kv_bytes")._value.get() == 1  # type: ignore[union-attr]

    asyncio.run(main())
