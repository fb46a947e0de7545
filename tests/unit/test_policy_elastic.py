"""The elastic-capacity decision (prfaas_core.policy.elastic): demand in instances, and the HPA-like sizing with
bounds, budget, tolerance, stabilisation windows and a scale-in step."""

from __future__ import annotations

import math

import pytest

from prfaas_core.api.common import SloSpec
from prfaas_core.capacity.hardware import builtin_hardware
from prfaas_core.policy.elastic import (
    Load,
    ScaleBehavior,
    ScaleBounds,
    ScaleMemory,
    decide_scale,
    decode_demand,
    forecast,
    link_bound_instances,
    pd_demand,
    prefill_demand,
    seeded,
    site_demand,
)
from prfaas_core.request.slo import ttft_objective_s

BOUNDS = ScaleBounds(min_instances=1, max_instances=10)
FAST = ScaleBehavior(scale_down_window_s=60.0, scale_down_step=2)


def test_demand_in_instances() -> None:
    # 8,000 tok/s arriving, nothing queued, 5,000 tok/s per instance at 80 %: 2 instances
    assert prefill_demand(8000, 0, 5000, 2.0, 0.8) == pytest.approx(2.0)
    # a backlog of 20,000 tokens cleared within a 2 s objective adds 10,000 tok/s of work
    assert prefill_demand(8000, 20_000, 5000, 2.0, 0.8) == pytest.approx(4.5)
    assert decode_demand(4000, 1000, 0.5) == pytest.approx(8.0)
    assert link_bound_instances(10.0, 0.001, 2000) == pytest.approx(5.0)
    with pytest.raises(ValueError, match="positive"):
        prefill_demand(1, 0, 0, 1, 0.8)


def test_site_demand_uses_the_model_the_ttft_objective_and_the_link_cap() -> None:
    hw = builtin_hardware("H200")
    assert hw is not None
    slo = SloSpec()
    load = Load(prompt_tokens_per_s=40_000, requests_per_s=5, waiting=4)
    need, why = site_demand(load, hw, slo, 0.8)
    length = 8000
    per_instance = length / hw.prefill_seconds(length)
    expected = (40_000 + 4 * length / ttft_objective_s(slo, length)) / (per_instance * 0.8)
    assert need == pytest.approx(expected)
    assert "mean prompt 8000" in why
    # twice the arrivals, about twice the instances: demand tracks load
    assert site_demand(Load(80_000, 10, 4), hw, slo, 0.8)[0] > 1.8 * site_demand(Load(40_000, 5, 4), hw, slo, 0.8)[0]


def test_pd_demand_adds_prefill_and_decode() -> None:
    hw = builtin_hardware("H20")
    assert hw is not None and hw.decode is not None
    need, why = pd_demand(Load(), Load(generation_tokens_per_s=hw.decode.tokens_per_second), hw, SloSpec(), 0.5)
    assert need == pytest.approx(2.0) and "decode 2.00" in why


def test_scales_out_at_once_and_reports_why() -> None:
    d = decide_scale(0.0, 2, 4.3, BOUNDS, FAST, ready=2, why="load")
    assert (d.desired, d.direction, d.blocked) == (5, "out", None)
    assert d.reason.startswith("scale out: demand 4.30 instances (load)") and "2 ready" in d.reason


def test_tolerance_band_holds_a_wobble() -> None:
    d = decide_scale(0.0, 5, 5.4, BOUNDS, FAST)
    assert d.desired == 5 and not d.changed and d.reason.startswith("hold")


def test_scale_in_waits_for_the_window_and_steps() -> None:
    mem = seeded(ScaleMemory(), 0.0, 8)
    current = 8
    history = []
    for t in range(10, 200, 10):  # demand falls to 1 at t=10 and stays there
        d = decide_scale(float(t), current, 1.0, BOUNDS, FAST, mem)
        mem, current = d.memory, d.desired
        history.append((t, current))
    # nothing moves inside the 60 s window (the seeded 8 is in it), then 2 per decision down to 1
    assert all(n == 8 for t, n in history if t < 60)
    assert [n for t, n in history if 60 <= t <= 90] == [6, 4, 2, 1]
    assert current == 1


def test_a_short_dip_does_not_scale_in() -> None:
    mem = seeded(ScaleMemory(), 0.0, 6)
    current = 6
    for t, demand in [(10, 6.0), (20, 2.0), (30, 2.0), (40, 6.0), (50, 6.0), (70, 6.0)]:
        d = decide_scale(float(t), current, demand, BOUNDS, FAST, mem)
        mem, current = d.memory, d.desired
        assert current == 6, (t, d.reason)


def test_bounds_and_budget_block_a_scale_out() -> None:
    d = decide_scale(0.0, 4, 20.0, BOUNDS)
    assert d.desired == 10 and d.blocked == "max" and "blocked by max 10" in d.reason
    budget = ScaleBounds(1, 10, budget_per_hour=100.0, price_per_instance_hour=30.0)
    assert budget.budget_instances() == 3
    d = decide_scale(0.0, 2, 20.0, budget)
    assert d.desired == 3 and d.blocked == "budget" and "budget 100/h" in d.reason
    # the link's cost is spent before any instance
    assert ScaleBounds(1, 10, 100.0, 30.0, fixed_cost_per_hour=40.0).budget_instances() == 2
    # bounds moved under the current size: obeyed at once, in either direction
    assert decide_scale(0.0, 12, 12.0, BOUNDS).desired == 10
    assert decide_scale(0.0, 0, 0.0, BOUNDS).desired == 1


def test_scale_up_window_takes_the_lowest_recommendation() -> None:
    slow = ScaleBehavior(scale_up_window_s=30.0)
    d1 = decide_scale(0.0, 2, 6.0, BOUNDS, slow, seeded(ScaleMemory(), 0.0, 2))
    assert d1.desired == 2 and "held" in d1.reason
    d2 = decide_scale(40.0, 2, 6.0, BOUNDS, slow, d1.memory)
    assert d2.desired == 6


def test_forecast_adds_the_rise_over_the_startup_time_only() -> None:
    rising = [(0.0, 1.0), (10.0, 2.0), (20.0, 3.0)]
    assert forecast(rising, 30.0) == pytest.approx(6.0)
    falling = [(0.0, 3.0), (10.0, 2.0), (20.0, 1.0)]
    assert forecast(falling, 30.0) == pytest.approx(1.0)
    assert forecast([], 10.0) == 0.0 and math.isclose(forecast([(0.0, 2.0)], 10.0), 2.0)


def test_bounds_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="min"):
        ScaleBounds(5, 2)


def test_site_demand_is_capped_by_what_the_link_carries() -> None:
    from prfaas_core.capacity.kv import kv_model_from_profile
    from prfaas_core.capacity.plan_inputs import case_study_specs

    hw = builtin_hardware("H200")
    assert hw is not None
    kv = kv_model_from_profile(case_study_specs()[0])
    load = Load(prompt_tokens_per_s=200_000, requests_per_s=10, waiting=0)
    free, _ = site_demand(load, hw, SloSpec(), 0.8, kv, link_cap_gbps=1000.0)
    tight, why = site_demand(load, hw, SloSpec(), 0.8, kv, link_cap_gbps=8.0)
    length = 20_000
    per_instance = length / hw.prefill_seconds(length)
    gbits_per_token = kv.kv_bytes(length) * 8 / 1e9 / length
    assert tight == pytest.approx(8.0 / (gbits_per_token * per_instance)) and tight < free
    assert "the link's cap 8 Gbps carries the KV of" in why
