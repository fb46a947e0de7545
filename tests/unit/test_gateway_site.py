"""A gateway serving several links of one site (prfaas_router.gateway.admission.SiteAdmission): each link books on
the site's calendar through the core's SiteCap, so the site's streams together never pass the site cap while each
link stays under its own cap; a prefill naming a link not scheduled here is a 400; one link and no site cap is the
single pair's admission as before."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from prfaas_core import names
from prfaas_core.api import RouterConfig
from prfaas_core.capacity.profiles import builtin_model_profiles
from prfaas_core.names import GBPS_BITS
from prfaas_core.policy.link_calendar import booked_gbps
from prfaas_router.gateway.admission import LinkAdmission, SiteAdmission, admission_for
from prfaas_router.gateway.pulls import Booking
from prfaas_router.state.metrics import RouterMetrics

MODEL = builtin_model_profiles()["internal-1t"].model_dump(mode="json", by_alias=True, exclude_none=True)
LINKS = ("east-to-site", "west-to-site")


def config(cap: float | None, links: tuple[str, ...] = LINKS, **admission: Any) -> RouterConfig:
    return RouterConfig.model_validate(
        {
            "pdCluster": "site",
            "mode": "gateway",
            "thresholdMinTokens": 0,
            "model": MODEL,
            "links": [{"name": n, "capacityGbps": 10.0, "maxUtilization": 0.8} for n in links],
            "endpoints": [{"name": "p0", "url": "http://127.0.0.1:1", "role": "prefill"}],
            "gateway": {
                "prefillCluster": "site",
                "siteEgressCapGbps": cap,
                "admission": {"link": links[0], "streamTiming": "layer-wise", **admission},
            },
        }
    )


def link(gw: SiteAdmission, name: str | None) -> LinkAdmission:
    adm = gw.of(name)
    assert isinstance(adm, LinkAdmission)
    return adm


def site(cap: float | None, links: tuple[str, ...] = LINKS, metrics: RouterMetrics | None = None) -> SiteAdmission:
    adm = admission_for(config(cap, links), None, metrics)
    assert adm is not None
    return adm


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.floats(0.0, 10.0), st.floats(0.1, 30.0), st.floats(0.1, 5.0)),
        min_size=1,
        max_size=30,
    )
)
def test_two_links_never_book_past_the_site_cap_together(reqs) -> None:  # type: ignore[no-untyped-def]
    gw = site(10.0)  # each link 8 Gbps, the site 10: the cap binds when both are busy
    now = 0.0
    for i, (east, dt, gbit, prefill) in enumerate(sorted(reqs, key=lambda r: r[1])):
        now = max(now, dt)
        adm = link(gw, LINKS[0] if east else LINKS[1])
        got = adm.decide(str(i), {names.HEADER_LINK: adm.link}, gbit * GBPS_BITS / 8.0, prefill, now)
        assert isinstance(got, Booking)
    assert gw.site is not None
    ledger = gw.site.ledger
    transfers = ledger.transfers(now)
    for t in transfers:
        at = t.start_s + t.stream_offset_s + 1e-7
        assert booked_gbps(transfers, at) <= 10.0 + 1e-6
    for adm in gw.all():  # each link under its own cap too
        mine = [ledger.get(k) for k in adm._keys]
        own = [t for t in mine if t is not None]
        for t in own:
            assert booked_gbps(own, t.start_s + t.stream_offset_s + 1e-7) <= 8.0 + 1e-6


def test_the_site_cap_is_whole_until_it_binds_then_shared_max_min_fair_and_exported() -> None:
    metrics = RouterMetrics()
    gw = site(10.0, metrics=metrics)
    east, west = link(gw, LINKS[0]), link(gw, LINKS[1])

    def shares() -> dict[str, float]:
        text = generate_latest(metrics.registry).decode()
        out = {}
        for name in LINKS:
            series = f'{names.METRIC_GATEWAY_SITE_SHARE_GBPS}{{link="{name}",site="site"}} '
            out[name] = float(next(x for x in text.splitlines() if x.startswith(series)).removeprefix(series))
        return out

    gbit = 8.0  # 1 s at 8 Gbps each (each link's own cap), the site has 10
    a = east.decide("a", {}, gbit * GBPS_BITS / 8.0, 1.0, 0.0)
    b = west.decide("b", {}, gbit * GBPS_BITS / 8.0, 1.0, 0.0)
    assert isinstance(a, Booking) and isinstance(b, Booking)
    # the demands (0.8 Gbps each over the demand window) fit under the cap: no link is held to a part of it, each
    # streams at its production rate, and the site cap puts west's after east's (8 + 8 > 10)
    assert a.window.rate_gbps == pytest.approx(8.0) and b.window.rate_gbps == pytest.approx(8.0)
    assert b.window.stream_start_s >= a.window.stream_end_s - 1e-9
    text = generate_latest(metrics.registry).decode()
    assert f'{names.METRIC_GATEWAY_SITE_CAP_GBPS}{{site="site"}} 10.0' in text
    assert shares() == pytest.approx(dict.fromkeys(LINKS, 10.0))
    # both ask 80 Gbit more: east's ask still fits (8.8 + 0.8), west's takes them past the cap (8.8 each): max-min
    # fair, 5 Gbps each of the 10, and west's stream is held to its 5
    c = east.decide("c", {}, 80.0 * GBPS_BITS / 8.0, 10.0, 0.0)
    d = west.decide("d", {}, 80.0 * GBPS_BITS / 8.0, 10.0, 0.0)
    assert isinstance(c, Booking) and isinstance(d, Booking)
    assert c.window.rate_gbps == pytest.approx(8.0) and d.window.rate_gbps == pytest.approx(5.0)
    assert shares() == pytest.approx(dict.fromkeys(LINKS, 5.0))


def test_a_link_not_scheduled_here_is_a_400_naming_the_links() -> None:
    gw = site(10.0)
    resp = gw.of("north-to-site")
    assert not isinstance(resp, LinkAdmission) and resp.status == 400
    assert resp.text is not None and "east-to-site" in resp.text and "west-to-site" in resp.text
    assert gw.of(None) is gw.links[LINKS[0]]  # no header: the primary link


def test_one_link_without_a_site_cap_books_as_before() -> None:
    gw = site(None, LINKS[:1])
    assert gw.site is None and link(gw, None).site is None
    metrics = RouterMetrics()
    admission_for(config(None, LINKS[:1]), None, metrics)
    assert names.METRIC_GATEWAY_SITE_CAP_GBPS + "{" not in generate_latest(metrics.registry).decode()


def test_a_reload_keeps_each_links_calendar() -> None:
    gw = site(10.0)
    east = gw.links[LINKS[0]]
    got = east.decide("a", {}, 8.0 * GBPS_BITS / 8.0, 1.0, 0.0)
    assert isinstance(got, Booking)
    again = admission_for(config(12.0), gw)
    assert again is not None and again.links[LINKS[0]] is east and again.site is gw.site
    assert again.site is not None and again.site.whole_cap_gbps == 12.0 and again.site.ledger.get("a") is not None
    dropped = admission_for(config(None), again)  # the cap dropped: every link afresh
    assert dropped is not None and dropped.site is None and dropped.links[LINKS[0]] is not east
