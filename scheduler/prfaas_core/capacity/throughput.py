"""The throughput model of paper §3.4.1 at one configuration: Eqs. 2–6, the two threshold bounds of
paper-spec §2.4, and TTFT over the length distribution. :mod:`prfaas_core.capacity.planner` searches over it; the
long-term role policy and the threshold policy call the same functions (one implementation of each).

For a threshold ``t`` the workload splits into ``p = P(L > t)``, ``l_long = E[L | L > t]`` and
``l_short = E[L | L ≤ t]`` (Table 4). Then::

    (3)  Θ_prfaas = min(N_prfaas / T_prf(l_long),  B_out / S̄_kv)         # compute vs egress
    (4)  Θ_pd-p   = N_p / T_pdp(l_short)
    (5)  Θ_pd-d   = N_d · BS_max / (T_decode · L_out)
    (6)  Λ_max    = min(Θ_prfaas / p,  Θ_pd-p / (1 − p),  Θ_pd-d)

``B_out`` is the link's *usable* bandwidth, capacity × ``maxUtilization`` (the cap admission enforces), and
``S̄_kv = E[S_kv(L) | L > t]`` — equal to the paper's ``S_kv(l_long)`` when ``S_kv`` is affine, and exact
otherwise. With this ``S̄_kv`` the egress at ``Λ_max``, ``Λ·p·S̄_kv`` (Eq. 2 over the offloaded requests),
never exceeds ``B_out``.

TTFT follows the reading that reproduces Table 6 (paper-spec §3.6): ``TTFT = T_prefill(L)`` on the hardware
the request is routed to, no queueing, over the length distribution; the KV transfer is hidden by
layer-wise pipelining. Pure functions over frozen inputs; no clock, no I/O.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..names import GBPS_BITS
from .curves import PiecewisePolynomial
from .kv import KvModel
from .plan_inputs import PlanInputs
from .workload import EmpiricalDistribution, LengthDistribution, expect, mean

PRFAAS_COMPUTE = "prfaas-compute"
PRFAAS_EGRESS = "prfaas-egress"
PD_PREFILL = "pd-prefill"
DECODE = "decode"

Route = tuple[float, float, PiecewisePolynomial]
"""Requests with ``lo < L ≤ hi`` are prefilled with latency curve ``T``."""


@dataclass(frozen=True)
class LengthSplit:
    """The workload at threshold ``t`` (Table 4): ``p``, ``l_long``, ``l_short``, and ``S̄_kv = E[S_kv | L > t]``."""

    threshold_tokens: float
    offload_fraction: float
    l_long_tokens: float
    l_short_tokens: float
    kv_long_bytes: float


def split_lengths(inputs: PlanInputs, threshold_tokens: float) -> LengthSplit:
    """``p(t)``, ``l_long(t) = PE(t)/p`` and ``l_short(t) = (E[L] − PE(t))/(1 − p)`` (paper-spec §2.4).

    At the ends, where a side is empty, its mean is the limit (the support's bound).
    """
    return LengthSplit(threshold_tokens, *_split(inputs, threshold_tokens))


def _split(inputs: PlanInputs, t: float, kv: bool = True) -> tuple[float, float, float, float]:
    """:func:`split_lengths`' ``(p, l_long, l_short, S̄_kv)``; without ``kv``, ``S̄_kv`` is not computed (nan)."""
    dist = inputs.lengths
    lo, hi = dist.support()
    p = _clamp(1.0 - dist.cdf(t))
    pe = dist.partial_moment(1, t, math.inf)
    l_short = (mean(dist) - pe) / (1.0 - p) if p < 1 else lo
    kv_tail = expect(dist, inputs.kv.curve, t, math.inf) if kv and p > 0 else math.nan
    l_long = pe / p if p > 0 else hi
    if not kv:
        return p, l_long, l_short, math.nan
    return p, l_long, l_short, kv_tail / p if p > 0 else inputs.kv.kv_bytes(hi)


def _clamp(p: float) -> float:
    """``p`` rounded at the ends of the support."""
    return 0.0 if p < 1e-12 else 1.0 if p > 1.0 - 1e-12 else p


@dataclass(frozen=True)
class OperatingPoint:
    """Eqs. 3–6 at one ``(t, N_prfaas, N_p, N_d)``, with the binding constraint and the egress at ``Λ_max``."""

    split: LengthSplit
    n_prfaas: int
    n_prefill: int
    n_decode: int
    theta_prfaas_compute: float
    theta_prfaas_egress: float
    theta_pd_p: float
    theta_pd_d: float
    throughput_rps: float
    binding: str
    egress_gbps: float

    @property
    def theta_prfaas(self) -> float:
        return min(self.theta_prfaas_compute, self.theta_prfaas_egress)

    @property
    def prfaas_rate(self) -> float:
        """``Θ_prfaas / p``: the arrival rate the PrFaaS stage can carry (inf when nothing is offloaded)."""
        p = self.split.offload_fraction
        return self.theta_prfaas / p if p > 0 else math.inf

    @property
    def pd_prefill_rate(self) -> float:
        """``Θ_pd-p / (1 − p)``: the arrival rate PD-P can carry (inf when everything is offloaded)."""
        p = self.split.offload_fraction
        return self.theta_pd_p / (1.0 - p) if p < 1 else math.inf

    def rates(self) -> dict[str, float]:
        """Each constraint's arrival-rate ceiling, keyed by its name (the binding one is the minimum)."""
        prfaas = PRFAAS_EGRESS if self.theta_prfaas_egress < self.theta_prfaas_compute else PRFAAS_COMPUTE
        return {prfaas: self.prfaas_rate, PD_PREFILL: self.pd_prefill_rate, DECODE: self.theta_pd_d}


def evaluate(inputs: PlanInputs, split: LengthSplit, n_prfaas: int, n_prefill: int, n_decode: int) -> OperatingPoint:
    """Eqs. 3–6 (and the egress of Eq. 2 over the offloaded requests) at one configuration."""
    t_prf = inputs.prfaas_hardware.prefill_seconds(split.l_long_tokens)
    t_pdp = inputs.pd_hardware.prefill_seconds(split.l_short_tokens)
    compute = n_prfaas / t_prf
    egress = inputs.usable_egress_bytes_per_s / split.kv_long_bytes if split.kv_long_bytes > 0 else math.inf
    theta_pd_p = n_prefill / t_pdp
    theta_pd_d = n_decode * inputs.decode_requests_per_second()
    partial = OperatingPoint(
        split, n_prfaas, n_prefill, n_decode, compute, egress, theta_pd_p, theta_pd_d, 0.0, "", 0.0
    )
    rates = partial.rates()
    binding = min(rates, key=lambda k: rates[k])
    lam = rates[binding]
    egress_gbps = lam * split.offload_fraction * split.kv_long_bytes * 8.0 / GBPS_BITS
    return OperatingPoint(
        split, n_prfaas, n_prefill, n_decode, compute, egress, theta_pd_p, theta_pd_d, lam, binding, egress_gbps
    )


def threshold_grid(dist: LengthDistribution, step_tokens: int = 100, max_points: int = 20_000) -> list[float]:
    """Candidate thresholds: 0 (offload everything), every ``step_tokens`` (coarser when the support is long,
    at most ``max_points``), and the top of the support (offload nothing)."""
    return list(_grid(dist.support()[1], step_tokens, max_points))


@functools.lru_cache(maxsize=64, typed=True)
def _grid(hi: float, step_tokens: int, max_points: int) -> tuple[float, ...]:
    """:func:`threshold_grid` of a support ending at ``hi`` (the long-term loop asks for the same one every cycle)."""
    step = max(step_tokens, math.ceil(hi / max_points))
    return (0.0, *(float(k * step) for k in range(1, math.ceil(hi / step))), hi)


def compute_balanced_threshold(inputs: PlanInputs, n_prefill: int, step_tokens: int = 100) -> int | None:
    """``t_bal``: where ``N_prfaas/(p·T_prf(l_long)) = N_p/((1 − p)·T_pdp(l_short))`` (Eq. 7, compute only).

    The smallest integer ``t`` where the PrFaaS ceiling reaches PD-P's: the first sign change on the grid,
    then an integer bisection. None when the curves never cross (e.g. no PrFaaS or no PD-P instances).

    Over observed lengths (an :class:`EmpiricalDistribution`) the split, hence the gap, is the same all along one
    step of the CDF: each step's gap is computed once (the long-term loop asks every cycle, and the grid has
    hundreds of points below ``t_bal`` but far fewer steps).
    """
    step_of = inputs.lengths.step_index if isinstance(inputs.lengths, EmpiricalDistribution) else None
    by_step: dict[int, float] = {}

    def gap(t: float) -> float:
        if step_of is None:
            return balance_gap(t)
        k = step_of(t)
        value = by_step.get(k)
        if value is None:
            value = by_step[k] = balance_gap(t)
        return value

    n_prfaas, prf_seconds, pd_seconds = (
        inputs.n_prfaas,
        inputs.prfaas_hardware.prefill_curve,
        inputs.pd_hardware.prefill_curve,
    )

    def balance_gap(t: float) -> float:
        p, l_long, l_short, _ = _split(inputs, t, kv=False)  # (split_lengths' p and means; S̄_kv is not read)
        if p <= 0:
            return math.inf
        if p >= 1:
            return -math.inf
        prf = n_prfaas / (p * prf_seconds(l_long))  # (prefill_seconds is its curve)
        pdp = n_prefill / ((1 - p) * pd_seconds(l_short))
        return prf - pdp

    if inputs.n_prfaas == 0 or n_prefill == 0:
        return None
    grid = _grid(inputs.lengths.support()[1], step_tokens, 20_000)  # gap(0) < 0: everything offloaded
    # the first grid point (after 0) whose gap is >= 0; over observed lengths, the grid points on a step already
    # seen are skipped (their gap is the step's: the first point on it, the one computed)
    ends = inputs.lengths.lengths if isinstance(inputs.lengths, EmpiricalDistribution) else None
    i, n = 1, len(grid)
    while i < n:
        t = grid[i]
        if gap(t) >= 0:
            below, above = math.floor(grid[i - 1]), math.ceil(t)
            while above - below > 1:
                mid = (below + above) // 2
                below, above = (below, mid) if gap(mid) >= 0 else (mid, above)
            return above
        if ends is None:
            i += 1
            continue
        k = bisect.bisect_right(ends, t)  # t's step: lengths[k - 1] <= t < lengths[k]
        if k >= len(ends):
            return None  # every later point is on the last step
        i = bisect.bisect_left(grid, ends[k], i + 1)  # the first point past the step
    return None


class BalancedThresholds:
    """:func:`compute_balanced_threshold` for one caller whose inputs seldom move, its last answers remembered.

    The operator keeps one per PD cluster (in its runtime) and hands it to the long-term loop's tick: at rest a
    cluster's inputs are the same every cycle, and Eq. 7 over a closed-form distribution is milliseconds a call.
    An answer is reused only for the exact inputs (:class:`PlanInputs` compared by equality: every field, the
    curves and the length distribution included), ``n_prefill`` and ``step_tokens``; anything else is computed.
    At most ``size`` answers are held, the least recently used dropped first (a cycle asks for a few prefill
    counts around the current one), so the memory is bounded by the callers that hold one. Not for concurrent
    use: one caller's cycles run one at a time.
    """

    def __init__(self, size: int = 8) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self.size = size
        self._answers: list[tuple[PlanInputs, int, int, int | None]] = []
        self.hits = 0
        self.misses = 0

    def __call__(self, inputs: PlanInputs, n_prefill: int, step_tokens: int = 100) -> int | None:
        answers = self._answers
        for i, answer in enumerate(answers):
            held, n, step, value = answer
            if n == n_prefill and step == step_tokens and (held is inputs or held == inputs):
                if i != len(answers) - 1:
                    answers.append(answers.pop(i))
                self.hits += 1
                return value
        value = compute_balanced_threshold(inputs, n_prefill, step_tokens)
        answers.append((inputs, n_prefill, step_tokens, value))
        if len(answers) > self.size:
            del answers[0]
        self.misses += 1
        return value

    def __len__(self) -> int:
        return len(self._answers)


def egress_floor_threshold(
    dist: LengthDistribution, kv: KvModel, arrival_rate_per_second: float, budget_gbps: float
) -> int:
    """``t_bw``: the smallest integer ``t`` with ``Λ·E[S_kv(L)·1{L > t}] ≤ budget`` (paper-spec §2.4).

    Egress falls as ``t`` grows, so this is an integer bisection; 0 when even offloading everything fits.
    The one implementation of the bandwidth bound: the planner calls it at ``Λ_max``, the threshold policy
    at the recent arrival rate and lengths.
    """
    budget_bytes = budget_gbps * GBPS_BITS / 8.0

    def fits(t: int) -> bool:
        return arrival_rate_per_second * expect(dist, kv.curve, t, math.inf) <= budget_bytes

    if fits(0):
        return 0
    bad, good = 0, math.ceil(dist.support()[1])  # nothing is offloaded at the top of the support
    while good - bad > 1:
        mid = (bad + good) // 2
        bad, good = (bad, mid) if fits(mid) else (mid, good)
    return good


def ttft_stats(dist: LengthDistribution, routes: Sequence[Route], quantile: float = 0.9) -> tuple[float, float]:
    """Mean and ``quantile`` of ``TTFT = T(L)`` with ``T`` chosen per route (no queueing; paper-spec §3.6).

    The mean is exact (partial moments); the quantile bisects the TTFT's CDF, where each route contributes
    ``P(lo < L ≤ min(hi, T⁻¹(x)))`` (latency curves never decrease with length).
    """
    support_lo, support_hi = dist.support()
    mean_s = sum(expect(dist, curve, lo, hi) for lo, hi, curve in routes)
    live = [(lo, hi, c, max(lo, support_lo), min(hi, support_hi)) for lo, hi, c in routes]
    live = [r for r in live if r[3] <= r[4]]

    def cdf(x: float) -> float:
        total = 0.0
        for lo, _, curve, a, b in live:
            if curve(a) <= x:
                total += dist.cdf(curve.inverse(x, a, b)) - (dist.cdf(lo) if lo > -math.inf else 0.0)
        return total

    x_lo = min(curve(a) for _, _, curve, a, _ in live)
    x_hi = max(curve(b) for _, _, curve, _, b in live)
    for _ in range(100):
        mid = 0.5 * (x_lo + x_hi)
        if cdf(mid) >= quantile - 1e-12:
            x_hi = mid
        else:
            x_lo = mid
        if x_hi - x_lo < 1e-9:
            break
    return mean_s, x_hi


def sweep_thresholds(
    inputs: PlanInputs, n_prefill: int, n_decode: int, thresholds: Sequence[float]
) -> tuple[OperatingPoint, ...]:
    """Eqs. 3–6 along ``t`` at a fixed split (paper Fig. 5b)."""
    return tuple(evaluate(inputs, split_lengths(inputs, t), inputs.n_prfaas, n_prefill, n_decode) for t in thresholds)
