"""Sizing within a budget (``prfaas plan --budget`` / ``--cheapest-for-rate``): one decision that sizes the PrFaaS
site and the PD cluster together, with the split and ``t``, on the planner's throughput model (Eqs. 3–8).

Cost per hour = instances x each hardware's ``pricePerInstanceHour`` + the KV the link carries (GB per hour at
the served rate) x the link's price per GB. Two questions:

- :func:`cheapest_for_rate`: the cheapest ``(N_prfaas, N_pd)`` whose best split and ``t`` sustain ``rate``
  (the planner's ``Λ_max`` is the rate at the decode SLO; ``headroom`` asks for more, e.g. 1.25).
- :func:`most_goodput_within`: the most throughput whose cost at that throughput fits ``budget_per_hour``.

Throughput grows with either count, so each ``N_prfaas`` needs one bisection over ``N_pd`` (the grid search of
:func:`~prfaas_core.capacity.planner._best_prfaas_point` runs on a coarse ``t`` grid there; the winner is
re-planned at full resolution).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from .plan_inputs import PlanInputError, PlanInputs
from .planner import PlanOptions, _best_prfaas_point
from .throughput import OperatingPoint

COARSE = PlanOptions(threshold_step_tokens=500, max_grid_points=400, refine=False)


@dataclass(frozen=True)
class Priced:
    """One sized deployment and what it costs per hour at ``rate_rps``."""

    point: OperatingPoint
    rate_rps: float
    instances_per_hour: float
    link_per_hour: float
    link_gb_per_hour: float

    @property
    def cost_per_hour(self) -> float:
        return self.instances_per_hour + self.link_per_hour


def _prices(inputs: PlanInputs) -> tuple[float, float]:
    prf, pd = inputs.prfaas_hardware.price_per_instance_hour, inputs.pd_hardware.price_per_instance_hour
    if prf is None or pd is None:
        raise PlanInputError(
            "a budget needs both hardware prices: set spec.hardware.pricePerInstanceHour on the PrefillCluster "
            "and the PDCluster"
        )
    return prf, pd


def price(inputs: PlanInputs, point: OperatingPoint, rate_rps: float, link_price_per_gb: float) -> Priced:
    """The cost per hour of ``point`` serving ``rate_rps``."""
    prf, pd = _prices(inputs)
    instances = point.n_prfaas * prf + (point.n_prefill + point.n_decode) * pd
    s = point.split
    gb_per_hour = rate_rps * s.offload_fraction * s.kv_long_bytes * 3600 / 1e9
    return Priced(point, rate_rps, instances, gb_per_hour * link_price_per_gb, gb_per_hour)


def _point(inputs: PlanInputs, n_prfaas: int, n_pd: int, options: PlanOptions) -> OperatingPoint | None:
    """The best split and ``t`` of ``n_pd`` instances; the roles' minimums hold, their maximums (set for the
    declared size) do not bind a cluster being sized."""
    sized = replace(
        inputs,
        n_prfaas=n_prfaas,
        n_pd=n_pd,
        prefill_bounds=(inputs.prefill_bounds[0], 100_000),
        decode_bounds=(inputs.decode_bounds[0], 100_000),
    )
    try:
        return _best_prfaas_point(sized, options)
    except PlanInputError:  # no split of n_pd fits the roles' bounds
        return None


def _first(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """The smallest n in [lo, hi] with ok(n), ok monotone (False... True...)."""
    if lo > hi or not ok(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def cheapest_for_rate(
    inputs: PlanInputs,
    rate_rps: float,
    link_price_per_gb: float = 0.0,
    max_prfaas: int = 16,
    max_pd: int = 64,
    headroom: float = 1.0,
) -> Priced | None:
    """The cheapest deployment that sustains ``rate_rps x headroom`` (None: none within the maxima)."""
    _prices(inputs)
    need = rate_rps * headroom
    best: Priced | None = None
    for n_prfaas in range(0, max_prfaas + 1):

        def enough(n_pd: int, n_prfaas: int = n_prfaas) -> bool:
            pt = _point(inputs, n_prfaas, n_pd, COARSE)
            return pt is not None and pt.throughput_rps >= need

        n_pd = _first(2, max_pd, enough)
        if n_pd is None:
            continue
        pt = _point(inputs, n_prfaas, n_pd, PlanOptions())
        if pt is None:
            continue
        priced = price(inputs, pt, rate_rps, link_price_per_gb)
        if best is None or priced.cost_per_hour < best.cost_per_hour - 1e-9:
            best = priced
    return best


def most_goodput_within(
    inputs: PlanInputs,
    budget_per_hour: float,
    link_price_per_gb: float = 0.0,
    max_prfaas: int = 16,
    max_pd: int = 64,
) -> Priced | None:
    """The deployment with the most throughput whose cost at that throughput fits the budget."""
    _prices(inputs)
    best: Priced | None = None

    def fits(n_prfaas: int, n_pd: int) -> Priced | None:
        pt = _point(inputs, n_prfaas, n_pd, COARSE)
        if pt is None:
            return None
        priced = price(inputs, pt, pt.throughput_rps, link_price_per_gb)
        return priced if priced.cost_per_hour <= budget_per_hour + 1e-9 else None

    for n_prfaas in range(0, max_prfaas + 1):

        def over_budget(n_pd: int, n_prfaas: int = n_prfaas) -> bool:
            return fits(n_prfaas, n_pd) is None

        over = _first(2, max_pd, over_budget)  # the first n_pd over budget
        top = (over - 1) if over is not None else max_pd
        if top < 2 or fits(n_prfaas, top) is None:
            continue
        pt = _point(inputs, n_prfaas, top, PlanOptions())
        if pt is None:
            continue
        priced = price(inputs, pt, pt.throughput_rps, link_price_per_gb)
        if priced.cost_per_hour > budget_per_hour + 1e-9:
            continue
        if best is None or pt.throughput_rps > best.point.throughput_rps + 1e-9:
            best = priced
    return best
