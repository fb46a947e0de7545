"""A fleet's remote choice (prfaas_core.policy.fleet.choose_site) and a site's egress cap (link_calendar.SiteCap,
shared max-min fair by fleet.site_shares): the best site by predicted TTFT, none with its breaker open or drained,
local when no site beats it, and a site calendar that never books its links together past the site cap nor a link
past its share."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prfaas_core.capacity.plan_inputs import case_study_inputs
from prfaas_core.names import GBPS_BITS
from prfaas_core.policy.breaker import BreakerBoard, BreakerParams
from prfaas_core.policy.fleet import SiteOption, choose_site, site_shares
from prfaas_core.policy.link_admission import AdmitTick, Booking, admit, book
from prfaas_core.policy.link_calendar import Deadline, SiteCap, booked_gbps
from prfaas_core.policy.link_state import EgressLedger, LinkParams, LinkState, Transfer
from prfaas_core.policy.routing import InstanceView, RouteRequest
from prfaas_core.policy.short_term import RemoteSide, RouteTick, route

LINK = LinkParams("l", 100.0, 0.8)  # cap 80 Gbps


def gbytes(gbits: float) -> float:
    return gbits * GBPS_BITS / 8.0


def option(
    site: str,
    ledger: EgressLedger | None = None,
    *,
    uncached: int = 40_000,
    t: int = 10_000,
    prefill_s: float = 2.0,
    gbits: float = 8.0,
    cap: SiteCap | None = None,
    now: float = 0.0,
    **kw: bool,
) -> SiteOption:
    tick = AdmitTick(now, gbytes(gbits), prefill_s, LINK, slo_ttft_s=10.0, site=cap)
    return SiteOption(site, f"r/{site}", ledger or EgressLedger(lanes=2, expire_s=1e9), {}, tick, uncached, t, **kw)


# --- the site cap's shares -------------------------------------------------------------------------------------


def test_shares_binding_cap_is_max_min_fair() -> None:
    shares = site_shares(10.0, {"a": 2.0, "b": 6.0, "c": 8.0})
    assert shares == pytest.approx({"a": 2.0, "b": 4.0, "c": 4.0})  # a keeps its demand, b and c split the rest


def test_shares_cap_not_binding_holds_no_link_to_a_part() -> None:
    # the demands fit under the cap: every link may book up to the whole cap (the site cap alone holds them together)
    assert site_shares(10.0, {"a": 1.0, "b": 3.0}) == {"a": 10.0, "b": 10.0}
    assert site_shares(10.0, {"a": 4.0, "b": 6.0}) == {"a": 10.0, "b": 10.0}  # exactly the cap: not binding yet
    assert site_shares(10.0, {}) == {}
    assert site_shares(9.0, {"a": 0.0, "b": 0.0, "c": 0.0}) == {"a": 9.0, "b": 9.0, "c": 9.0}


def test_shares_reject_negative_input() -> None:
    with pytest.raises(ValueError, match="site cap"):
        site_shares(-1.0, {"a": 1.0})
    with pytest.raises(ValueError, match="demands"):
        site_shares(1.0, {"a": -1.0})


@settings(max_examples=80, deadline=None)
@given(st.floats(0.0, 100.0), st.dictionaries(st.sampled_from("abcdef"), st.floats(0.0, 50.0), max_size=6))
def test_shares_sum_to_a_binding_cap_and_no_link_below_min_of_demand_and_equal(
    cap: float, demands: dict[str, float]
) -> None:
    shares = site_shares(cap, demands)
    if not demands:
        return
    if sum(demands.values()) > cap + 1e-9:  # binding: the cap split, max-min fair
        assert sum(shares.values()) == pytest.approx(cap, abs=1e-6)
    else:  # not binding: every link may take the whole cap
        assert all(s == cap for s in shares.values())
    equal = cap / len(demands)
    for k, d in demands.items():
        assert cap + 1e-6 >= shares[k] >= min(d, equal) - 1e-6


# --- the choice -------------------------------------------------------------------------------------------------


def test_the_site_with_the_lower_predicted_ttft_wins() -> None:
    busy = EgressLedger(lanes=1, expire_s=1e9)
    busy.reserve("queued", Transfer(0.0, 0.0, 5.0, 0))  # its one lane busy for 5 s
    choice = choose_site([option("busy", busy), option("idle")], local_ttft_s=30.0, slo_ttft_s=10.0)
    assert choice.target == "remote" and choice.site == "idle" and choice.link == "r/idle"
    assert isinstance(choice.booking, Booking) and choice.predicted_ttft_s == pytest.approx(2.0)


def test_ties_keep_the_callers_preference_order() -> None:
    choice = choose_site([option("first"), option("second")], local_ttft_s=30.0, slo_ttft_s=10.0)
    assert choice.site == "first"


def test_all_breakers_open_goes_local() -> None:
    opts = [option("a", breaker_open=True), option("b", breaker_open=True)]
    choice = choose_site(opts, local_ttft_s=30.0, slo_ttft_s=10.0)
    assert choice.target == "local" and choice.booking is None
    assert choice.skipped == (("a", "breaker open"), ("b", "breaker open"))


def test_a_drained_site_is_not_chosen() -> None:
    choice = choose_site([option("a", drained=True), option("b", prefill_s=3.0)], local_ttft_s=30.0)
    assert choice.site == "b" and ("a", "drained") in choice.skipped
    only = choose_site([option("a", drained=True)], local_ttft_s=30.0)
    assert only.target == "local"


def test_below_each_links_t_is_local() -> None:
    choice = choose_site([option("a", uncached=5_000), option("b", uncached=5_000, t=4_000)], local_ttft_s=30.0)
    assert choice.site == "b"  # t is per link
    assert choose_site([option("a", uncached=5_000)], local_ttft_s=30.0).target == "local"


def test_local_when_no_site_beats_it() -> None:
    # every remote misses the objective while local makes it on an idle PD prefill
    choice = choose_site([option("a", prefill_s=20.0)], local_ttft_s=4.0, slo_ttft_s=10.0, local_wait_s=0.0)
    assert choice.target == "local" and choice.predicted_ttft_s == pytest.approx(20.0)
    # without an objective: by predicted TTFT
    assert choose_site([option("a", prefill_s=5.0)], local_ttft_s=4.0).target == "local"
    assert choose_site([option("a", prefill_s=3.0)], local_ttft_s=4.0).target == "remote"


def test_a_site_whose_gateway_declines_is_skipped() -> None:
    full = SiteCap(cap_gbps=0.0, share_gbps=0.0)
    choice = choose_site([option("a", cap=full), option("b")], local_ttft_s=30.0)
    assert choice.site == "b" and choice.skipped[0][0] == "a" and "overloaded" in choice.skipped[0][1]


# --- the site calendar: the link and the site cap booked together ----------------------------------------------


def test_site_cap_binding_splits_by_the_shares() -> None:
    site = EgressLedger(lanes=8, expire_s=1e9)
    keys: dict[str, set[str]] = {"a": set(), "b": set()}
    shares = site_shares(10.0, {"a": 8.0, "b": 8.0})  # both ask more than half: 5 Gbps each
    deadlines: dict[str, Deadline] = {}
    for i in range(4):
        for link in ("a", "b"):
            cap = SiteCap(10.0, shares[link], frozenset(keys[link]))
            answer = admit(site, deadlines, AdmitTick(0.0, gbytes(16.0), 2.0, LINK, lane_order="arrival", site=cap))
            assert isinstance(answer, Booking)
            key = f"{link}{i}"
            book(site, deadlines, key, answer)
            keys[link].add(key)
    for at in [x / 4 for x in range(0, 80)]:
        by_link = {
            link: sum(t.rate_gbps for k in ks if (t := site.get(k)) and t.stream_start_s <= at < t.stream_end_s)
            for link, ks in keys.items()
        }
        assert by_link["a"] <= 5.0 + 1e-6 and by_link["b"] <= 5.0 + 1e-6
        assert booked_gbps(site.transfers(0.0), at) <= 10.0 + 1e-6
    # each link got its share's worth: four 16-Gbit streams each at 5 Gbps take 12.8 s per link
    ends = {link: max(site.get(k).stream_end_s for k in ks) for link, ks in keys.items()}  # type: ignore[union-attr]
    assert ends["a"] == pytest.approx(ends["b"], rel=0.05)


def test_a_burst_on_one_link_may_take_the_whole_cap_while_it_does_not_bind() -> None:
    # two links ask 3 Gbps each of a 10-Gbps site: a 16-Gbit prefill of 2 s (8 Gbps produced) streams at its
    # production rate, not at half the cap (fixed halves left one link's half idle while the other's burst waited)
    site = EgressLedger(lanes=2, expire_s=1e9)
    shares = site_shares(10.0, {"a": 3.0, "b": 3.0})
    answer = admit(site, {}, AdmitTick(0.0, gbytes(16.0), 2.0, LINK, site=SiteCap(10.0, shares["a"], frozenset())))
    assert isinstance(answer, Booking) and answer.window.rate_gbps == pytest.approx(8.0)
    # once they ask more than the cap, each link is held to its max-min fair share
    bound = site_shares(10.0, {"a": 8.0, "b": 8.0})
    held = admit(site, {}, AdmitTick(0.0, gbytes(16.0), 2.0, LINK, site=SiteCap(10.0, bound["a"], frozenset())))
    assert isinstance(held, Booking) and held.window.rate_gbps <= 5.0 + 1e-9


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.floats(0.0, 20.0), st.floats(0.5, 30.0), st.floats(0.2, 4.0)),
        min_size=1,
        max_size=25,
    ),
    st.lists(st.floats(0.0, 12.0), min_size=3, max_size=3),
)
def test_site_calendar_never_passes_the_site_cap_even_as_shares_move(
    asks: list[tuple[str, float, float, float]], demands: list[float]
) -> None:
    site_cap = 9.0
    site = EgressLedger(lanes=3, expire_s=1e9)
    keys: dict[str, set[str]] = {"a": set(), "b": set(), "c": set()}
    deadlines: dict[str, Deadline] = {}
    now = 0.0
    for i, (link, gap, gbits, prefill) in enumerate(asks):
        now += gap / 10
        rotated = demands[i % 3 :] + demands[: i % 3]  # the shares move between bookings
        shares = site_shares(site_cap, dict(zip("abc", rotated, strict=True)))
        cap = SiteCap(site_cap, shares[link], frozenset(keys[link]))
        answer = admit(site, deadlines, AdmitTick(now, gbytes(gbits), prefill, LINK, site=cap))
        if isinstance(answer, Booking):
            assert answer.window.rate_gbps <= shares[link] + 1e-6
            book(site, deadlines, f"{link}{i}", answer)
            keys[link].add(f"{link}{i}")
    transfers = site.transfers(now)
    points = sorted({t.stream_start_s for t in transfers})
    assert all(booked_gbps(transfers, p) <= site_cap + 1e-6 for p in points)


def test_without_a_site_the_calendar_is_the_links_own() -> None:
    a, b = EgressLedger(lanes=2, expire_s=1e9), EgressLedger(lanes=2, expire_s=1e9)
    tick = AdmitTick(0.0, gbytes(8.0), 2.0, LINK)
    wide = SiteCap(math.inf, math.inf, frozenset())
    plain = admit(a, {}, tick)
    with_site = admit(b, {}, AdmitTick(0.0, gbytes(8.0), 2.0, LINK, site=wide))
    assert isinstance(plain, Booking) and isinstance(with_site, Booking)
    assert plain.window == with_site.window


# --- the router's pick among its remotes (short_term.route) -----------------------------------------------------


def _router_tick(ledgers: dict[str, EgressLedger], remotes: tuple[RemoteSide, ...], **kw: object) -> RouteTick:
    inputs = case_study_inputs()
    tick = RouteTick(
        0.0,
        RouteRequest(60_000),
        19_400,
        inputs.kv,
        inputs.prfaas_hardware.prefill_seconds,
        inputs.pd_hardware.prefill_seconds,
        {k: LinkParams(k, 100.0) for k in ledgers},
        {k: LinkState() for k in ledgers},
        ledgers,
        remotes,
        prefill=[InstanceView("p0", queued_prefill_s=30.0)],
        decode=[InstanceView("d0")],
    )
    return replace(tick, **kw)  # type: ignore[arg-type]


def test_router_picks_the_remote_with_the_lower_predicted_ttft() -> None:
    busy = EgressLedger(lanes=1)
    busy.reserve("queued", Transfer(0.0, 0.0, 20.0, 0))  # the first site's one lane busy for 20 s
    ledgers = {"to-a": busy, "to-b": EgressLedger(lanes=1)}
    remotes = (RemoteSide("site-a", "to-a"), RemoteSide("site-b", "to-b"))
    plan = route(_router_tick(ledgers, remotes))
    assert plan.decision.target == "remote" and plan.remote is not None and plan.remote.name == "site-b"
    # equal predictions keep the configured order; a cached prefix at the second site makes it faster
    even = {"to-a": EgressLedger(lanes=1), "to-b": EgressLedger(lanes=1)}
    assert route(_router_tick(even, remotes)).remote.name == "site-a"  # type: ignore[union-attr]
    cached = (RemoteSide("site-a", "to-a"), RemoteSide("site-b", "to-b", cached_tokens=40_000))
    assert route(_router_tick(even, cached)).remote.name == "site-b"  # type: ignore[union-attr]
    # an open breaker or a site not ready is no candidate
    board = BreakerBoard()
    params = BreakerParams()
    board.tripped("site-b", 0.0, "connect refused")
    plan = route(_router_tick(ledgers, remotes, breakers=board, breaker_params=params))
    assert plan.remote is not None and plan.remote.name == "site-a"
    down = (RemoteSide("site-a", "to-a", "no ready PrFaaS instance"), RemoteSide("site-b", "to-b", "drained"))
    assert route(_router_tick(ledgers, down)).decision.target == "local"
