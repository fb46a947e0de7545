"""The capacity planner: paper Eqs. 7–8 solved by search over the threshold ``t`` and the split ``N_p/N_d``,
on the throughput model of Eqs. 2–6 (:mod:`prfaas_core.capacity.throughput`, re-exported here).

The optimum (§3.4.2) is found like the paper, by exhaustive search: a grid on ``t`` (every 100 tokens by
default) × every integer split with ``N_p + N_d`` = the PD instances (within the roles' bounds), then a local
refinement of ``t`` to the token. Ties (a decode-bound plateau) go to the most prefill headroom, i.e. the
Eq. 7 balance. The plan also reports ``t_bal`` (Eq. 7 with compute only) and ``t_bw`` (the smallest ``t``
whose egress at ``Λ_max`` fits ``B_out``, paper-spec §2.4); the chosen ``t`` is ``max(t_bal, t_bw)``, and
its egress never exceeds the link's usable bandwidth (capacity × ``maxUtilization``).

Baselines (paper §4.3): *homogeneous PD* — all instances of the PD hardware (default ``N_pd + N_prfaas``),
best integer split, ``p = 0``; *naive heterogeneous* — every prefill on the PrFaaS instances (``p = 1``, so
``Θ_prfaas = N_prfaas / T_prf(E[L])``), every PD instance decodes. Each deployment carries its TTFT (mean,
P90), its cost when prices are given, and the reason (binding constraint, slack) in words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..names import GBPS_BITS
from .plan_inputs import PlanInputError, PlanInputs, case_study_inputs, plan_inputs_from_specs
from .throughput import (
    DECODE,
    PD_PREFILL,
    PRFAAS_COMPUTE,
    PRFAAS_EGRESS,
    BalancedThresholds,
    LengthSplit,
    OperatingPoint,
    compute_balanced_threshold,
    egress_floor_threshold,
    evaluate,
    split_lengths,
    sweep_thresholds,
    threshold_grid,
    ttft_stats,
)
from .workload import LengthDistribution

__all__ = [
    "DECODE",
    "PD_PREFILL",
    "PRFAAS_COMPUTE",
    "PRFAAS_EGRESS",
    "BalancedThresholds",
    "Deployment",
    "LengthSplit",
    "OperatingPoint",
    "Plan",
    "PlanInputError",
    "PlanInputs",
    "PlanOptions",
    "TargetLoad",
    "bandwidth_floor_threshold",
    "case_study_inputs",
    "compute_balanced_threshold",
    "egress_floor_threshold",
    "evaluate",
    "plan",
    "plan_inputs_from_specs",
    "split_lengths",
    "sweep_splits",
    "sweep_thresholds",
    "target_load",
    "ttft_stats",
]


@dataclass(frozen=True)
class PlanOptions:
    """Search resolution."""

    threshold_step_tokens: int = 100
    max_grid_points: int = 20_000
    refine: bool = True


def _splits(inputs: PlanInputs, total: int, bounded_above: bool = True) -> list[tuple[int, int]]:
    """Integer splits ``N_p + N_d = total`` within the roles' bounds (only the minimums when not
    ``bounded_above``: the homogeneous baseline is a bigger, hypothetical cluster)."""
    (pmin, pmax), (dmin, dmax) = inputs.prefill_bounds, inputs.decode_bounds
    if not bounded_above:
        pmax = dmax = total
    out = [(n_p, total - n_p) for n_p in range(total + 1) if pmin <= n_p <= pmax and dmin <= total - n_p <= dmax]
    if not out:
        raise PlanInputError(
            f"PDCluster spec.roles: no prefill/decode split of {total} instances fits prefill "
            f"[{pmin}, {pmax}] and decode [{dmin}, {dmax}]"
        )
    return out


def _grid(dist: LengthDistribution, options: PlanOptions) -> list[float]:
    return threshold_grid(dist, options.threshold_step_tokens, options.max_grid_points)


def _headroom(point: OperatingPoint) -> float:
    """The second-tightest ceiling: breaks ties on a plateau in favour of the Eq. 7 balance."""
    return sorted(point.rates().values())[1]


def _refine(inputs: PlanInputs, best: OperatingPoint, lo: float, hi: float) -> OperatingPoint:
    """Golden-section search on ``t`` in ``[lo, hi]`` for the best split, to the token."""

    def at(t: float) -> OperatingPoint:
        return evaluate(inputs, split_lengths(inputs, t), best.n_prfaas, best.n_prefill, best.n_decode)

    inv_phi = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = lo, hi
    for _ in range(60):
        c, d = b - inv_phi * (b - a), a + inv_phi * (b - a)
        if at(c).throughput_rps >= at(d).throughput_rps:
            b = d
        else:
            a = c
        if b - a < 0.5:
            break
    candidates = [at(float(math.floor(a))), at(float(math.ceil(b))), best]
    return max(candidates, key=lambda pt: (pt.throughput_rps, _headroom(pt)))


def _best_prfaas_point(inputs: PlanInputs, options: PlanOptions) -> OperatingPoint:
    """Exhaustive search over the ``t`` grid × the allowed splits (the paper's 2-D grid search), then a
    refinement of ``t``. The inner loop works on the three rate ceilings only; :func:`evaluate` builds the
    winner."""
    grid = _grid(inputs.lengths, options)
    splits = _splits(inputs, inputs.n_pd)
    decode_per_instance = inputs.decode_requests_per_second()
    best_key, best_t, best_split = (-1.0, -1.0), grid[0], splits[0]
    for t in grid:
        s = split_lengths(inputs, t)
        p = s.offload_fraction
        if p > 0:
            compute = inputs.n_prfaas / inputs.prfaas_hardware.prefill_seconds(s.l_long_tokens)
            egress = inputs.usable_egress_bytes_per_s / s.kv_long_bytes if s.kv_long_bytes > 0 else math.inf
            prfaas_rate = min(compute, egress) / p
        else:
            prfaas_rate = math.inf
        pd_per_instance = (
            1.0 / (inputs.pd_hardware.prefill_seconds(s.l_short_tokens) * (1.0 - p)) if p < 1 else math.inf
        )
        for n_p, n_d in splits:
            ceilings = sorted((prfaas_rate, n_p * pd_per_instance if n_p else 0.0, n_d * decode_per_instance))
            key = (ceilings[0], ceilings[1])
            if key > best_key:
                best_key, best_t, best_split = key, t, (n_p, n_d)
    best = evaluate(inputs, split_lengths(inputs, best_t), inputs.n_prfaas, *best_split)
    i = grid.index(best_t)
    if options.refine and best.binding != DECODE and 0 < i < len(grid) - 1:
        best = _refine(inputs, best, grid[i - 1], grid[i + 1])
    return best


def bandwidth_floor_threshold(inputs: PlanInputs, arrival_rate_per_second: float) -> int:
    """``t_bw(Λ)`` for the plan's link: the usable bandwidth ``B_out`` as the budget."""
    return egress_floor_threshold(inputs.lengths, inputs.kv, arrival_rate_per_second, inputs.usable_egress_gbps)


@dataclass(frozen=True)
class Deployment:
    """One deployment's operating point, TTFT, cost and the reason it is what it is."""

    name: str
    point: OperatingPoint
    ttft_mean_s: float
    ttft_p90_s: float
    cost_per_hour: float | None
    reason: str

    @property
    def throughput_per_cost(self) -> float | None:
        """Requests per unit of currency (Λ·3600 / cost per hour), when prices are known."""
        if self.cost_per_hour is None or self.cost_per_hour <= 0:
            return None
        return self.point.throughput_rps * 3600.0 / self.cost_per_hour


@dataclass(frozen=True)
class Plan:
    """The PrFaaS-PD plan and both baselines, with the thresholds that explain ``t``."""

    prfaas_pd: Deployment
    homogeneous_pd: Deployment
    naive_heterogeneous: Deployment
    link_capacity_gbps: float
    usable_egress_gbps: float
    threshold_balanced_tokens: int | None
    threshold_bandwidth_floor_tokens: int
    target: TargetLoad | None
    reason: str

    def throughput_ratio(self, deployment: Deployment) -> float:
        """Λ_max relative to homogeneous PD (Table 6's "Ratio")."""
        base = self.homogeneous_pd.point.throughput_rps
        return deployment.point.throughput_rps / base if base > 0 else math.inf

    def equal_cost_ratio(self, deployment: Deployment) -> float | None:
        """Throughput per cost relative to homogeneous PD (the paper's "at equal cost"), when priced."""
        mine, base = deployment.throughput_per_cost, self.homogeneous_pd.throughput_per_cost
        return mine / base if mine is not None and base else None


def _cost(inputs: PlanInputs, n_prfaas: int, n_pd: int) -> float | None:
    prf, pd = inputs.prfaas_hardware.price_per_instance_hour, inputs.pd_hardware.price_per_instance_hour
    if (n_prfaas and prf is None) or (n_pd and pd is None):
        return None
    return n_prfaas * (prf or 0.0) + n_pd * (pd or 0.0)


def _explain(point: OperatingPoint) -> str:
    rates = point.rates()
    lam = point.throughput_rps
    if lam <= 0:
        return f"no throughput: {point.binding} has no capacity"
    others = ", ".join(
        f"{k} {v:.2f} (+{(v / lam - 1) * 100:.0f}%)" for k, v in rates.items() if k != point.binding and v < math.inf
    )
    return f"bound by {point.binding} at {lam:.2f} req/s" + (f"; slack: {others}" if others else "")


def _prfaas_reason(inputs: PlanInputs, point: OperatingPoint, t_bal: int | None, t_bw: int) -> str:
    s = point.split
    parts = [
        f"t = {s.threshold_tokens:.0f} tokens offloads p = {s.offload_fraction:.1%} "
        f"(l_long {s.l_long_tokens:.0f}, l_short {s.l_short_tokens:.0f}) with {point.n_prefill}P/{point.n_decode}D",
        _explain(point),
        f"egress {point.egress_gbps:.1f} of {inputs.usable_egress_gbps:.1f} Gbps usable",
    ]
    if point.theta_prfaas_egress < point.theta_prfaas_compute:
        parts.append(
            f"t raised above the compute balance (t_bal = {t_bal}) to the bandwidth floor (t_bw = {t_bw}) "
            "so egress stays within the link's cap"
        )
    elif t_bal is not None and abs(s.threshold_tokens - t_bal) <= max(1.0, 0.01 * t_bal):
        parts.append(f"t is the compute balance of Eq. 7 (t_bal = {t_bal}; bandwidth floor t_bw = {t_bw})")
    else:
        parts.append(f"compute balance t_bal = {t_bal}, bandwidth floor t_bw = {t_bw}")
    return "; ".join(parts)


@dataclass(frozen=True)
class TargetLoad:
    """The plan at the workload's expected arrival rate (when one is given)."""

    arrival_rate_per_second: float
    feasible: bool
    utilization: float
    egress_gbps: float
    link_utilization: float
    threshold_bandwidth_floor_tokens: int
    reason: str


def target_load(inputs: PlanInputs, point: OperatingPoint, rate: float) -> TargetLoad:
    """Egress and headroom of ``point`` at arrival rate ``rate`` (Eq. 2 over the offloaded requests)."""
    s = point.split
    egress = rate * s.offload_fraction * s.kv_long_bytes * 8.0 / GBPS_BITS
    util = rate / point.throughput_rps if point.throughput_rps > 0 else math.inf
    feasible = util <= 1.0
    why = (
        f"{rate:.2f} req/s is {util:.0%} of Λ_max {point.throughput_rps:.2f}"
        if feasible
        else f"{rate:.2f} req/s exceeds Λ_max {point.throughput_rps:.2f} ({point.binding} saturates)"
    )
    return TargetLoad(
        rate, feasible, util, egress, egress / inputs.link_capacity_gbps, bandwidth_floor_threshold(inputs, rate), why
    )


def plan(inputs: PlanInputs, options: PlanOptions | None = None) -> Plan:
    """The throughput-optimal PrFaaS-PD configuration (Eqs. 7–8 by search) and the two baselines."""
    opts = options or PlanOptions()
    dist = inputs.lengths
    hi = dist.support()[1]
    prfaas_curve, pd_curve = inputs.prfaas_hardware.prefill_curve, inputs.pd_hardware.prefill_curve

    best = _best_prfaas_point(inputs, opts)
    t = best.split.threshold_tokens
    t_bal = compute_balanced_threshold(inputs, best.n_prefill, opts.threshold_step_tokens)
    t_bw = bandwidth_floor_threshold(inputs, best.throughput_rps)
    mean_s, p90_s = ttft_stats(dist, [(-math.inf, t, pd_curve), (t, math.inf, prfaas_curve)])
    prfaas_pd = Deployment(
        "prfaas_pd",
        best,
        mean_s,
        p90_s,
        _cost(inputs, inputs.n_prfaas, inputs.n_pd),
        _prfaas_reason(inputs, best, t_bal, t_bw),
    )

    n_h = inputs.homogeneous_count
    everything_local = split_lengths(inputs, hi)
    homog = max(
        (evaluate(inputs, everything_local, 0, n_p, n_d) for n_p, n_d in _splits(inputs, n_h, bounded_above=False)),
        key=lambda pt: (pt.throughput_rps, _headroom(pt)),
    )
    mean_s, p90_s = ttft_stats(dist, [(-math.inf, math.inf, pd_curve)])
    homogeneous = Deployment(
        "homogeneous_pd",
        homog,
        mean_s,
        p90_s,
        _cost(inputs, 0, n_h),
        f"{n_h} × {inputs.pd_hardware.accelerator}, best split {homog.n_prefill}P/{homog.n_decode}D; "
        + _explain(homog),
    )

    naive_point = evaluate(inputs, split_lengths(inputs, 0.0), inputs.n_prfaas, 0, inputs.n_pd)
    mean_s, p90_s = ttft_stats(dist, [(-math.inf, math.inf, prfaas_curve)])
    naive = Deployment(
        "naive_heterogeneous",
        naive_point,
        mean_s,
        p90_s,
        _cost(inputs, inputs.n_prfaas, inputs.n_pd),
        f"every prefill on {inputs.n_prfaas} × {inputs.prfaas_hardware.accelerator}, every decode on "
        f"{inputs.n_pd} × {inputs.pd_hardware.accelerator}, no threshold; " + _explain(naive_point),
    )
    gain = best.throughput_rps / homog.throughput_rps if homog.throughput_rps > 0 else math.inf
    return Plan(
        prfaas_pd,
        homogeneous,
        naive,
        inputs.link_capacity_gbps,
        inputs.usable_egress_gbps,
        t_bal,
        t_bw,
        target_load(inputs, best, inputs.arrival_rate_per_second) if inputs.arrival_rate_per_second else None,
        f"PrFaaS-PD {best.throughput_rps:.2f} req/s vs homogeneous {homog.throughput_rps:.2f} ({gain:.2f}×) "
        f"and naive heterogeneous {naive_point.throughput_rps:.2f}",
    )


def sweep_splits(inputs: PlanInputs, threshold_tokens: float) -> tuple[OperatingPoint, ...]:
    """Eqs. 3–6 over every allowed split at a fixed ``t`` (paper Fig. 5a)."""
    split = split_lengths(inputs, threshold_tokens)
    return tuple(evaluate(inputs, split, inputs.n_prfaas, n_p, n_d) for n_p, n_d in _splits(inputs, inputs.n_pd))
