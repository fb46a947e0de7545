"""The gateway's admission (prfaas_router.admission): two replicas each book cap / 2, so together they never
pass the cap; a window later than the caller accepts is a 429 decline; bad headers are a 400."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from prfaas_core import names
from prfaas_core.api import AdmissionDecline, GatewayAdmission, RouterLink
from prfaas_core.names import GBPS_BITS
from prfaas_core.policy.link_calendar import booked_gbps
from prfaas_router.admission import Booking, LinkAdmission

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


def test_bad_headers_are_400_naming_them() -> None:
    adm = replica(1)
    for headers in ({names.HEADER_KV_BYTES: "x"}, {names.HEADER_MAX_WAIT_MS: "-1"}, {names.HEADER_LINK: "other"}):
        resp = adm.decide("k", headers, 1.0, 1.0, 0.0)
        assert not isinstance(resp, Booking) and resp.status == 400
        assert resp.body is not None and "x-prfaas" in bytes(resp.body).decode()  # type: ignore[arg-type]
