"""Sizing within a budget (prfaas_core.capacity.budget): checked against brute force on the throughput model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from prfaas_core.capacity.budget import _point, cheapest_for_rate, most_goodput_within, price
from prfaas_core.capacity.plan_inputs import PlanInputError, case_study_specs, plan_inputs_from_specs
from prfaas_core.capacity.planner import PlanInputs, PlanOptions


def priced_inputs(prfaas_price: float | None = 40.0, pd_price: float | None = 16.0) -> PlanInputs:
    inputs = plan_inputs_from_specs(*case_study_specs())
    return replace(
        inputs,
        prfaas_hardware=replace(inputs.prfaas_hardware, price_per_instance_hour=prfaas_price),
        pd_hardware=replace(inputs.pd_hardware, price_per_instance_hour=pd_price),
    )


def every(inputs: PlanInputs, max_prfaas: int, max_pd: int) -> list:  # type: ignore[type-arg]
    out = []
    for k in range(max_prfaas + 1):
        for n in range(2, max_pd + 1):
            pt = _point(inputs, k, n, PlanOptions())
            if pt is not None:
                out.append(pt)
    return out


@pytest.mark.parametrize("link_price", [0.0, 0.002])
def test_cheapest_for_rate_is_the_cheapest_that_sustains_it(link_price: float) -> None:
    inputs = priced_inputs()
    rate = 2.0
    found = cheapest_for_rate(inputs, rate, link_price, max_prfaas=2, max_pd=10)
    assert found is not None and found.point.throughput_rps >= rate
    costs = [
        price(inputs, pt, rate, link_price).cost_per_hour for pt in every(inputs, 2, 10) if pt.throughput_rps >= rate
    ]
    assert found.cost_per_hour == pytest.approx(min(costs))
    # the cost is instances x price + the link's GB at the rate x its price
    pt = found.point
    assert found.instances_per_hour == pt.n_prfaas * 40.0 + (pt.n_prefill + pt.n_decode) * 16.0
    s = pt.split
    assert found.link_gb_per_hour == pytest.approx(rate * s.offload_fraction * s.kv_long_bytes * 3600 / 1e9)


def test_cheap_prfaas_hardware_is_used_and_headroom_costs_more() -> None:
    inputs = priced_inputs(prfaas_price=8.0, pd_price=16.0)
    found = cheapest_for_rate(inputs, 2.0, 0.0, max_prfaas=6, max_pd=12)
    assert found is not None and found.point.n_prfaas > 0
    roomy = cheapest_for_rate(inputs, 2.0, 0.0, max_prfaas=6, max_pd=12, headroom=1.5)
    assert roomy is not None and roomy.point.throughput_rps >= 3.0 and roomy.cost_per_hour > found.cost_per_hour


def test_most_goodput_within_a_budget() -> None:
    inputs = priced_inputs()
    budget = 300.0
    found = most_goodput_within(inputs, budget, 0.0, max_prfaas=2, max_pd=10)
    assert found is not None and found.cost_per_hour <= budget
    best = max(
        pt.throughput_rps
        for pt in every(inputs, 2, 10)
        if price(inputs, pt, pt.throughput_rps, 0.0).cost_per_hour <= budget
    )
    assert found.point.throughput_rps == pytest.approx(best, rel=0.02)
    assert most_goodput_within(inputs, 10.0, max_prfaas=2, max_pd=10) is None  # not even two PD instances


def test_a_budget_needs_prices() -> None:
    with pytest.raises(PlanInputError, match="pricePerInstanceHour"):
        cheapest_for_rate(priced_inputs(prfaas_price=None), 1.0)
