"""The fleet planner (prfaas_core.capacity.fleet): one pair plans as the single-pair planner does; a site cap, a thin
link and a drain move the flows and say what binds; the LP it routes with solves a known program."""

from __future__ import annotations

import pytest

from prfaas_core.capacity.fleet import Fleet, FleetLink, FleetRegion, FleetSite, plan_fleet
from prfaas_core.capacity.lp import maximize
from prfaas_core.capacity.planner import case_study_inputs, plan

INPUTS = case_study_inputs()  # 4 x H200 PrFaaS, 8 x H20 PD, the paper's workload


def site(name: str, cap: float | None = None, drained: bool = False) -> FleetSite:
    return FleetSite(name, INPUTS.prfaas_hardware, 4, cap, drained)


def test_the_lp_solves_a_known_program() -> None:
    # max x + y: x + 2y <= 4, 3x + y <= 6 -> x = 1.6, y = 1.2
    value, (x, y) = maximize([1.0, 1.0], [[1.0, 2.0], [3.0, 1.0]], [4.0, 6.0])
    assert value == pytest.approx(2.8) and (x, y) == (pytest.approx(1.6), pytest.approx(1.2))
    with pytest.raises(ValueError, match="unbounded"):
        maximize([1.0], [[-1.0]], [1.0])


def test_one_pair_plans_as_the_single_pair_planner() -> None:
    single = plan(INPUTS).prfaas_pd.point
    fleet = Fleet((site("s"),), (FleetRegion("r", INPUTS, 1.0),), (FleetLink("l", "r", "s", 80.0),))
    result = plan_fleet(fleet)
    assert result.fleet_rps == pytest.approx(single.throughput_rps, rel=0.005)
    assert result.regions[0].threshold_tokens == pytest.approx(single.split.threshold_tokens, abs=200)
    assert result.binding == ("site s: its 4 instances",)  # the paper's case study is PrFaaS-compute bound
    assert result.gains[0].resource == "site s" and result.gains[0].fleet_rps_gain > 0


def three_by_two(cap: float | None, thin: float = 80.0, drained: str = "") -> Fleet:
    links = tuple(
        FleetLink(f"r{r}-s{s}", f"r{r}", f"s{s}", thin if (r, s) == (1, 2) else 80.0, f"r{r}-s{s}" == drained)
        for r in (1, 2, 3)
        for s in (1, 2)
    )
    regions = tuple(FleetRegion(f"r{r}", INPUTS, 1.0) for r in (1, 2, 3))
    return Fleet((site("s1", cap), site("s2")), regions, links)


def test_a_site_cap_and_a_thin_link_bind_and_every_cap_holds() -> None:
    free = plan_fleet(three_by_two(None), gains=False)
    tight = plan_fleet(three_by_two(5.0, thin=2.0))
    assert tight.multiplier < free.multiplier
    assert "site s1: its egress cap 5 Gbps" in tight.binding and "link r1-s2: its cap 2 Gbps" in tight.binding
    for link in tight.links:
        assert link.egress_gbps <= link.cap_gbps * (1 + 1e-6)
    s1 = next(s for s in tight.sites if s.name == "s1")
    assert s1.egress_gbps <= 5.0 * (1 + 1e-6)
    best = tight.gains[0]
    assert best.resource == "site s1 egress cap" and best.fleet_rps_gain > 0


def test_a_drained_link_carries_nothing_and_a_drained_site_nothing_at_all() -> None:
    result = plan_fleet(three_by_two(None, drained="r1-s1"), gains=False)
    assert next(x for x in result.links if x.name == "r1-s1").rate_rps == 0
    assert next(x for x in result.links if x.name == "r1-s2").rate_rps > 0  # r1's long prefills go to s2
    fleet = three_by_two(None)
    lost = Fleet((site("s1", drained=True), fleet.sites[1]), fleet.regions, fleet.links)
    result = plan_fleet(lost, gains=False)
    assert next(s for s in result.sites if s.name == "s1").rate_rps == 0
    assert result.multiplier < plan_fleet(fleet, gains=False).multiplier


def test_a_second_link_between_one_pair_is_refused() -> None:
    with pytest.raises(ValueError, match="second link"):
        Fleet(
            (site("s"),), (FleetRegion("r", INPUTS, 1.0),), (FleetLink("a", "r", "s", 8), FleetLink("b", "r", "s", 8))
        )
