"""The planner (paper Eqs. 2–8): Table 6 reproduced, egress never above the cap, baselines, TTFT, cost."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace
from functools import cache

import pytest

from prfaas_core.api import HardwareSpec, PrefillPolynomial, PrefillTimePoint, PrefillTimeSpec
from prfaas_core.capacity.curves import PiecewisePolynomial
from prfaas_core.capacity.hardware import HardwareProfileError, hardware_from_spec
from prfaas_core.capacity.kv import KvModel
from prfaas_core.capacity.plan_inputs import case_study_specs
from prfaas_core.capacity.planner import (
    DECODE,
    PD_PREFILL,
    PRFAAS_COMPUTE,
    PRFAAS_EGRESS,
    Plan,
    PlanInputError,
    PlanInputs,
    bandwidth_floor_threshold,
    case_study_inputs,
    compute_balanced_threshold,
    egress_floor_threshold,
    evaluate,
    plan,
    plan_inputs_from_specs,
    split_lengths,
    sweep_splits,
    sweep_thresholds,
    threshold_grid,
    ttft_stats,
)
from prfaas_core.capacity.workload import EmpiricalDistribution, mean


@cache
def case_plan() -> Plan:
    return plan(case_study_inputs())


def with_link(gbps: float) -> PlanInputs:
    return replace(case_study_inputs(), link_capacity_gbps=gbps)


# --- Table 6 (acceptance: ±3 %, egress ±10 %) ------------------------------------------------------------


def test_prfaas_pd_reproduces_table6() -> None:
    d = case_plan().prfaas_pd
    pt, s = d.point, d.point.split
    assert s.threshold_tokens == pytest.approx(19_400, rel=0.03)
    assert (pt.n_prfaas, pt.n_prefill, pt.n_decode) == (4, 3, 5)
    assert pt.throughput_rps == pytest.approx(3.24, rel=0.03)
    assert s.offload_fraction == pytest.approx(0.496, rel=0.03)
    assert s.l_long_tokens / 1024 == pytest.approx(44, rel=0.03)
    assert pt.theta_prfaas == pytest.approx(1.61, rel=0.03)
    assert pt.theta_pd_p == pytest.approx(1.64, rel=0.03)
    assert pt.theta_pd_d == pytest.approx(3.91, rel=0.03)
    assert d.ttft_mean_s == pytest.approx(2.22, rel=0.03)
    assert d.ttft_p90_s == pytest.approx(3.51, rel=0.03)
    assert pt.egress_gbps == pytest.approx(13, rel=0.10)


def test_homogeneous_baseline_reproduces_table6() -> None:
    d = case_plan().homogeneous_pd
    assert (d.point.n_prfaas, d.point.n_prefill, d.point.n_decode) == (0, 9, 3)
    assert d.point.throughput_rps == pytest.approx(2.11, rel=0.03)
    assert d.point.theta_pd_d == pytest.approx(2.35, rel=0.03)
    assert d.point.binding == PD_PREFILL
    assert d.ttft_mean_s == pytest.approx(4.44, rel=0.03)
    assert d.ttft_p90_s == pytest.approx(9.73, rel=0.03)
    assert d.point.egress_gbps == 0


def test_naive_heterogeneous_baseline_reproduces_table6() -> None:
    inputs = case_study_inputs()
    d = case_plan().naive_heterogeneous
    assert (d.point.n_prfaas, d.point.n_prefill, d.point.n_decode) == (4, 0, 8)
    assert d.point.split.offload_fraction == 1.0
    # Θ_prfaas = N_prfaas / T_prf(E[L]) (the paper's reading)
    assert d.point.theta_prfaas == pytest.approx(4 / inputs.prfaas_hardware.prefill_seconds(mean(inputs.lengths)))
    assert d.point.throughput_rps == pytest.approx(2.45, rel=0.03)
    assert d.point.theta_pd_d == pytest.approx(6.25, rel=0.03)
    assert d.ttft_mean_s == pytest.approx(1.74, rel=0.03)
    assert d.ttft_p90_s == pytest.approx(3.51, rel=0.03)


def test_ratios_match_the_papers_headline() -> None:
    result = case_plan()
    assert result.throughput_ratio(result.prfaas_pd) == pytest.approx(1.54, rel=0.03)
    assert result.throughput_ratio(result.naive_heterogeneous) == pytest.approx(1.16, rel=0.03)
    assert result.prfaas_pd.ttft_p90_s / result.homogeneous_pd.ttft_p90_s == pytest.approx(0.36, abs=0.02)


# --- Structure of the optimum (Eqs. 7, 8; t* = max(t_bal, t_bw)) ------------------------------------------


def test_optimum_balances_both_prefill_stages_and_leaves_decode_slack() -> None:
    pt = case_plan().prfaas_pd.point
    assert pt.prfaas_rate == pytest.approx(pt.pd_prefill_rate, rel=0.005)  # Eq. 7
    assert pt.theta_pd_d > pt.throughput_rps  # integer split: decode has slack (Eq. 8 approximately)
    assert pt.binding in (PRFAAS_COMPUTE, PD_PREFILL)
    assert "compute balance of Eq. 7" in case_plan().prfaas_pd.reason


@pytest.mark.parametrize("gbps", [100.0, 10.0, 5.0])
def test_threshold_is_the_larger_of_balance_and_bandwidth_floor(gbps: float) -> None:
    result = plan(with_link(gbps))
    t = result.prfaas_pd.point.split.threshold_tokens
    t_bal = result.threshold_balanced_tokens
    assert t_bal is not None
    assert t == pytest.approx(max(t_bal, result.threshold_bandwidth_floor_tokens), rel=0.01)


@pytest.mark.parametrize("gbps", [400.0, 100.0, 20.0, 10.0, 5.0, 1.0, 0.2])
def test_egress_never_exceeds_the_usable_bandwidth(gbps: float) -> None:
    inputs = with_link(gbps)
    pt = plan(inputs).prfaas_pd.point
    assert pt.egress_gbps <= inputs.link_capacity_gbps * inputs.link_max_utilization * (1 + 1e-9)


def test_a_10_gbps_link_raises_the_threshold_and_egress_binds() -> None:
    fat, thin = plan(with_link(100)), plan(with_link(10))
    assert thin.prfaas_pd.point.split.threshold_tokens > fat.prfaas_pd.point.split.threshold_tokens
    pt = thin.prfaas_pd.point
    assert pt.theta_prfaas_egress < pt.theta_prfaas_compute
    assert pt.egress_gbps == pytest.approx(8.0, rel=0.01)
    assert thin.threshold_balanced_tokens is not None
    assert pt.split.threshold_tokens > thin.threshold_balanced_tokens
    assert "bandwidth floor" in thin.prfaas_pd.reason
    assert pt.throughput_rps < fat.prfaas_pd.point.throughput_rps


def test_bandwidth_floor_is_zero_with_ample_bandwidth_and_tight_when_scarce() -> None:
    inputs = with_link(10)
    assert bandwidth_floor_threshold(case_study_inputs(), 3.2) == 0
    t_bw = bandwidth_floor_threshold(inputs, 3.0)
    per_s = inputs.usable_egress_bytes_per_s

    def egress(t: float) -> float:
        s = split_lengths(inputs, t)
        return 3.0 * s.offload_fraction * s.kv_long_bytes

    assert egress(t_bw) <= per_s < egress(t_bw - 1)


def test_egress_floor_on_an_empirical_window_is_the_smallest_feasible_length() -> None:
    one_byte_per_token = KvModel(PiecewisePolynomial.polynomial(0, 1), 1.0, 0.0, "architecture")
    window = EmpiricalDistribution.from_lengths([100, 200, 300])
    gbps_of = 8 / 1e9  # bytes/s -> Gbps
    # E[S·1{L>t}] is 200 B below 100, 166.7 B below 200, 100 B below 300, 0 from 300
    assert egress_floor_threshold(window, one_byte_per_token, 1.0, 200 * gbps_of) == 0
    assert egress_floor_threshold(window, one_byte_per_token, 1.0, 100 * gbps_of) == 200
    assert egress_floor_threshold(window, one_byte_per_token, 1.0, 99 * gbps_of) == 300
    assert egress_floor_threshold(window, one_byte_per_token, 2.0, 350 * gbps_of) == 100


def test_a_huge_prfaas_cluster_makes_decode_bind_and_keeps_prefill_headroom() -> None:
    inputs = replace(case_study_inputs(), n_prfaas=40, link_capacity_gbps=1000)
    pt = plan(inputs).prfaas_pd.point
    assert pt.binding == DECODE
    assert pt.throughput_rps == pytest.approx(pt.theta_pd_d)
    assert min(pt.prfaas_rate, pt.pd_prefill_rate) >= pt.throughput_rps


def test_without_prfaas_instances_nothing_is_offloaded() -> None:
    pt = plan(replace(case_study_inputs(), n_prfaas=0)).prfaas_pd.point
    assert pt.split.offload_fraction == 0
    assert pt.egress_gbps == 0
    assert pt.throughput_rps > 0


# --- The piecewise-linear and quadratic H200 reconstructions (paper-spec §3.6) ----------------------------


def _with_h200(prefill_time: PrefillTimeSpec) -> PlanInputs:
    hw = hardware_from_spec(HardwareSpec(accelerator="H200", prefill_time=prefill_time))
    return replace(case_study_inputs(), prfaas_hardware=hw)


def test_piecewise_linear_h200_gives_the_paper_spec_reconstruction() -> None:
    points = [(1024, 0.44), (8192, 0.72), (32768, 1.84), (131072, 7.40)]
    spec = PrefillTimeSpec(points=[PrefillTimePoint(length_tokens=n, seconds=s) for n, s in points])
    pt = plan(_with_h200(spec)).prfaas_pd.point
    assert pt.split.threshold_tokens == pytest.approx(19_600, rel=0.01)
    assert (pt.n_prefill, pt.n_decode) == (3, 5)
    assert pt.throughput_rps == pytest.approx(3.20, abs=0.01)
    assert pt.egress_gbps == pytest.approx(12.0, abs=0.1)


def test_quadratic_h200_gives_the_paper_spec_reconstruction() -> None:
    poly = PrefillPolynomial(c0_seconds=0.3891, c1_seconds_per_token=4.107e-5, c2_seconds_per_token_squared=9.476e-11)
    pt = plan(_with_h200(PrefillTimeSpec(polynomial=poly))).prfaas_pd.point
    assert pt.split.threshold_tokens == pytest.approx(19_200, rel=0.01)
    assert (pt.n_prefill, pt.n_decode) == (3, 5)
    assert pt.throughput_rps == pytest.approx(3.30, abs=0.01)
    assert pt.egress_gbps == pytest.approx(12.5, abs=0.1)


# --- Sweeps (Fig. 5) ----------------------------------------------------------------------------------------


def test_sweep_over_splits_peaks_at_the_plan() -> None:
    best = case_plan().prfaas_pd.point
    points = sweep_splits(case_study_inputs(), best.split.threshold_tokens)
    assert [p.n_prefill for p in points] == list(range(1, 8))
    assert max(points, key=lambda p: p.throughput_rps).n_prefill == 3


def test_sweep_over_thresholds_crosses_at_the_plan() -> None:
    best = case_plan().prfaas_pd.point
    ts = [1000.0 * i for i in range(1, 61)]
    points = sweep_thresholds(case_study_inputs(), 3, 5, ts)
    prf = [p.prfaas_rate for p in points]
    pdp = [p.pd_prefill_rate for p in points]
    assert all(b >= a for a, b in itertools.pairwise(prf))  # Θ_prfaas/p rises with t
    assert all(b <= a for a, b in itertools.pairwise(pdp))  # Θ_pd-p/(1−p) falls with t
    crossing = next(t for t, a, b in zip(ts, prf, pdp, strict=True) if a >= b)
    assert crossing == pytest.approx(best.split.threshold_tokens, abs=1000)
    assert max(p.throughput_rps for p in points) <= best.throughput_rps + 1e-9


# --- TTFT, cost, targets, other workloads ------------------------------------------------------------------


def test_ttft_stats_on_a_small_empirical_example() -> None:
    dist = EmpiricalDistribution.from_lengths(range(1, 11))
    identity = PiecewisePolynomial.polynomial(0, 1)
    tenth = PiecewisePolynomial.polynomial(0, 0.1)
    # lengths 1..5 locally at l seconds, 6..10 remotely at l/10: TTFTs 1..5 and 0.6..1.0
    mean_s, p90 = ttft_stats(dist, [(-math.inf, 5, identity), (5, math.inf, tenth)])
    assert mean_s == pytest.approx((15 + 4.0) / 10)
    assert p90 == pytest.approx(4.0, abs=1e-6)


def test_cost_aware_comparison_with_prices() -> None:
    inputs = case_study_inputs()
    priced = replace(
        inputs,
        prfaas_hardware=replace(inputs.prfaas_hardware, price_per_instance_hour=2.0),
        pd_hardware=replace(inputs.pd_hardware, price_per_instance_hour=1.0),
    )
    result = plan(priced)
    assert result.prfaas_pd.cost_per_hour == 4 * 2.0 + 8 * 1.0
    assert result.homogeneous_pd.cost_per_hour == 12 * 1.0
    ratio = result.equal_cost_ratio(result.prfaas_pd)
    assert ratio == pytest.approx(result.throughput_ratio(result.prfaas_pd) * 12 / 16)
    assert ratio == pytest.approx(1.15, abs=0.03)  # paper: "approximately 15 %" at H200 ≈ 2 × H20
    assert case_plan().prfaas_pd.cost_per_hour is None
    assert case_plan().equal_cost_ratio(case_plan().prfaas_pd) is None


def test_homogeneous_instance_count_is_an_input() -> None:
    small = plan(replace(case_study_inputs(), homogeneous_instances=8)).homogeneous_pd
    assert small.point.n_prefill + small.point.n_decode == 8
    assert small.point.throughput_rps < case_plan().homogeneous_pd.point.throughput_rps


def test_target_arrival_rate_reports_headroom_and_egress() -> None:
    result = plan(replace(case_study_inputs(), arrival_rate_per_second=2.0))
    target = result.target
    assert target is not None and target.feasible
    assert target.utilization == pytest.approx(2.0 / result.prfaas_pd.point.throughput_rps)
    assert target.egress_gbps == pytest.approx(result.prfaas_pd.point.egress_gbps * target.utilization)
    over = plan(replace(case_study_inputs(), arrival_rate_per_second=5.0)).target
    assert over is not None and not over.feasible
    assert case_plan().target is None


def test_an_empirical_sample_of_the_case_study_plans_alike() -> None:
    rng = random.Random(3)
    base = case_study_inputs()
    sample = EmpiricalDistribution.from_lengths(base.lengths.sample(rng) for _ in range(5000))
    pt = plan(replace(base, lengths=sample)).prfaas_pd.point
    assert pt.throughput_rps == pytest.approx(case_plan().prfaas_pd.point.throughput_rps, rel=0.05)
    assert (pt.n_prefill, pt.n_decode) == (3, 5)


# --- Inputs from specs --------------------------------------------------------------------------------------


def test_inputs_from_specs_use_link_cap_and_role_bounds() -> None:
    profile, prefill, pd, link, workload = case_study_specs()
    inputs = plan_inputs_from_specs(profile, prefill, pd, link.model_copy(update={"max_utilization": 0.5}), workload)
    assert inputs.usable_egress_gbps == pytest.approx(50.0)
    assert (inputs.n_prfaas, inputs.n_pd, inputs.homogeneous_count) == (4, 8, 12)
    assert inputs.prefill_bounds == (1, 1024)


def test_role_bounds_that_allow_no_split_are_an_error() -> None:
    inputs = replace(case_study_inputs(), prefill_bounds=(5, 8), decode_bounds=(5, 8))
    with pytest.raises(PlanInputError, match=r"spec\.roles"):
        plan(inputs)


def test_role_bounds_limit_the_split() -> None:
    pt = plan(replace(case_study_inputs(), prefill_bounds=(4, 7))).prfaas_pd.point
    assert pt.n_prefill >= 4


def test_pd_hardware_without_decode_capacity_is_an_error() -> None:
    profile, prefill, pd, link, workload = case_study_specs()
    points = [PrefillTimePoint(length_tokens=1000, seconds=1.0), PrefillTimePoint(length_tokens=2000, seconds=2.0)]
    odd = pd.model_copy(
        update={"hardware": HardwareSpec(accelerator="X9", prefill_time=PrefillTimeSpec(points=points))}
    )
    with pytest.raises(PlanInputError, match=r"PDCluster spec\.hardware\.decode"):
        plan_inputs_from_specs(profile, prefill, odd, link, workload)


def test_unknown_prefill_hardware_is_an_error_naming_the_object() -> None:
    profile, prefill, pd, link, workload = case_study_specs()
    odd = prefill.model_copy(update={"hardware": HardwareSpec(accelerator="X9")})
    with pytest.raises(HardwareProfileError, match=r"PrefillCluster spec\.hardware\.accelerator: 'X9'"):
        plan_inputs_from_specs(profile, odd, pd, link, workload)


def test_plan_is_deterministic() -> None:
    assert plan(case_study_inputs()) == plan(case_study_inputs())


@pytest.mark.parametrize("binding", [PRFAAS_COMPUTE, PRFAAS_EGRESS, PD_PREFILL, DECODE])
def test_binding_names_are_the_documented_strings(binding: str) -> None:
    assert binding in {"prfaas-compute", "prfaas-egress", "pd-prefill", "decode"}


def test_split_lengths_at_the_ends_of_the_support() -> None:
    inputs = case_study_inputs()
    everything = split_lengths(inputs, 0)
    assert everything.offload_fraction == 1.0
    assert everything.l_long_tokens == pytest.approx(mean(inputs.lengths))
    nothing = split_lengths(inputs, 131_072)
    assert nothing.offload_fraction == 0.0
    assert nothing.l_short_tokens == pytest.approx(mean(inputs.lengths))


def test_compute_balanced_threshold_is_the_first_integer_past_the_crossing() -> None:
    inputs = case_study_inputs()
    t_bal = compute_balanced_threshold(inputs, 3)
    assert t_bal is not None

    def gap(t: float) -> float:
        pt = evaluate(inputs, split_lengths(inputs, t), 4, 3, 5)
        return pt.theta_prfaas_compute / pt.split.offload_fraction - pt.pd_prefill_rate

    assert gap(t_bal) >= 0 > gap(t_bal - 1)
    assert compute_balanced_threshold(inputs, 0) is None
    assert compute_balanced_threshold(replace(inputs, n_prfaas=0), 3) is None


def test_compute_balanced_threshold_over_observed_lengths_is_the_first_grid_crossing() -> None:
    """Over an empirical distribution each CDF step's gap is computed once: the answer is still the first grid point
    whose gap reaches 0 (then bisected), checked here against the plain scan for many observed samples."""
    base = case_study_inputs()
    rng = random.Random(7)

    def gap(inputs: PlanInputs, n_p: int, t: float) -> float:
        s = split_lengths(inputs, t)
        if not 0 < s.offload_fraction < 1:
            return math.inf if s.offload_fraction <= 0 else -math.inf
        prf = inputs.n_prfaas / (s.offload_fraction * inputs.prfaas_hardware.prefill_seconds(s.l_long_tokens))
        pdp = n_p / ((1 - s.offload_fraction) * inputs.pd_hardware.prefill_seconds(s.l_short_tokens))
        return prf - pdp

    def scan(inputs: PlanInputs, n_p: int) -> int | None:
        for prev, t in itertools.pairwise(threshold_grid(inputs.lengths)):
            if gap(inputs, n_p, t) >= 0:
                below, above = math.floor(prev), math.ceil(t)
                while above - below > 1:
                    mid = (below + above) // 2
                    below, above = (below, mid) if gap(inputs, n_p, mid) >= 0 else (mid, above)
                return above
        return None

    found = 0
    for _ in range(12):
        lengths = [max(1, int(rng.lognormvariate(9.5, 1.3))) for _ in range(rng.choice([20, 200, 800]))]
        inputs = replace(base, lengths=EmpiricalDistribution.from_lengths(lengths))
        for n_p in (1, 3, 8):
            expected = scan(inputs, n_p)
            found += expected is not None
            assert compute_balanced_threshold(inputs, n_p) == expected
    assert found > 0
