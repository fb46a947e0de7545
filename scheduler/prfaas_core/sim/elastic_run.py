"""Elastic capacity against the best static deployment, on one scenario's request sequence.

*Static*: ``prfaas_pd`` (live ``t``, role loop, link windows) at fixed sizes. Which sizes: what an operator would
deploy — the planner's cheapest deployment (:func:`~prfaas_core.capacity.budget.cheapest_for_rate`) for the
busiest stretch of the day, taken window by window (each window's rate and its own length mix, sizes the
elementwise maximum over windows) — plus its neighbourhood (±1 PrFaaS, ±1 PD instance), then a walk down from the
best of them while the objective still holds (one PrFaaS or one PD instance fewer: the planner's sizes may be more
than the simulated day needs; or one PrFaaS more for two PD fewer, or one PD more for two PrFaaS fewer, where that
is fewer GPUs: the peak's neighbourhood can miss a cheaper split of the same day). The best static is the fewest
GPU-hours among those whose attainment meets the objective (the scenario's ``search.attainment``). (Searching
every ``N_prfaas x N_pd x split`` would be ~1000 day-long runs; the planner is the tool that sizes a deployment, so
it picks the candidates.)

*Elastic*: the same deployment starting at the planner's sizes, with :class:`~prfaas_core.sim.elastic.ElasticLoop`
sizing both clusters within ``prfaas`` and ``pd`` bounds; the role loop splits whatever PD instances there are.

GPU-hours = instance-hours x each hardware's GPUs per instance; cost = instance-hours x price + the link's GB x
price (the prices are the planner's example prices unless given).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from ..capacity.budget import cheapest_for_rate
from ..capacity.plan_inputs import PlanInputs
from ..capacity.workload import EmpiricalDistribution
from ..policy.elastic import ScaleBehavior, ScaleBounds
from .config import SimConfig
from .deployments import plan_deployments
from .elastic import ElasticLoop, ElasticParams, ElasticTrace
from .metrics import RunSummary, summarize
from .results import RunResult
from .scenario import SimElasticSpec
from .search import Prepared
from .simulation import Simulation

EXAMPLE_PRICES = (40.0, 16.0, 0.002)
"""Per PrFaaS instance-hour, per PD instance-hour, per link GB (``docs/planning.md``'s example prices; the
scenario's ``elastic`` block's defaults)."""


@dataclass(frozen=True)
class Outcome:
    """One day-long run, costed."""

    name: str
    n_prfaas: float
    n_pd: float
    """Fixed sizes, or the time-averaged ones of an elastic run."""
    summary: RunSummary
    gpu_hours: float
    instance_hours: float
    cost: float
    trace: ElasticTrace | None = None

    @property
    def attainment(self) -> float:
        return self.summary.slo_attainment


def _cost(
    prepared: Prepared, result: RunResult, prf_s: float, pd_s: float, prices: tuple[float, float, float]
) -> tuple[float, float, float]:
    inputs = prepared.planned.inputs
    prf_h, pd_h = prf_s / 3600.0, pd_s / 3600.0
    gpu = prf_h * inputs.prfaas_hardware.gpus_per_instance + pd_h * inputs.pd_hardware.gpus_per_instance
    cost = prf_h * prices[0] + pd_h * prices[1] + result.transferred_bytes / 1e9 * prices[2]
    return gpu, prf_h + pd_h, cost


def sized_config(prepared: Prepared, n_prfaas: int, n_pd: int) -> SimConfig:
    """``prfaas_pd`` at ``n_prfaas`` + ``n_pd`` (the planner's split and ``t`` for that size)."""
    sc = prepared.scenario
    cluster = sc.cluster.model_copy(update={"prfaas_instances": n_prfaas, "pd_instances": n_pd})
    sized = sc.model_copy(update={"cluster": cluster, "deployments": ["prfaas_pd"]})
    cfg = plan_deployments(sized, prepared.requests).configs["prfaas_pd"]
    return replace(cfg, name=f"static_{n_prfaas}prf_{n_pd}pd")


def _summary(prepared: Prepared, result: RunResult, duration_s: float, requests: Iterable[float]) -> RunSummary:
    warmup = min(0.1 * duration_s, 120.0)
    return summarize(
        result, list(requests), warmup, prepared.shift_s(duration_s), prepared.scenario.search.max_queue_growth
    )


def run_static(
    prepared: Prepared, n_prfaas: int, n_pd: int, prices: tuple[float, float, float] = EXAMPLE_PRICES
) -> Outcome:
    cfg = sized_config(prepared, n_prfaas, n_pd)
    duration = prepared.scenario.duration_seconds
    result = Simulation(cfg, prepared.requests, duration).run()
    summary = _summary(prepared, result, duration, (r.arrival_s for r in prepared.requests))
    gpu, inst, cost = _cost(prepared, result, n_prfaas * duration, n_pd * duration, prices)
    return Outcome(cfg.name, n_prfaas, n_pd, summary, gpu, inst, cost)


def run_elastic(
    prepared: Prepared,
    start: tuple[int, int],
    params: ElasticParams,
    prices: tuple[float, float, float] = EXAMPLE_PRICES,
) -> Outcome:
    """``prfaas_pd`` starting at ``start`` = (PrFaaS, PD) with both clusters elastic."""
    cfg = sized_config(prepared, *start)
    rp = cfg.role_params
    top = params.pd.max_instances
    cfg = replace(
        cfg,
        name="elastic",
        role_params=replace(rp, prefill_max=top - rp.decode_min, decode_max=top - rp.prefill_min),
    )
    duration = prepared.scenario.duration_seconds
    sim = Simulation(cfg, prepared.requests, duration)
    loop = ElasticLoop(sim, params).install()
    result = sim.run()
    trace = loop.finish(duration)
    summary = _summary(prepared, result, duration, (r.arrival_s for r in prepared.requests))
    gpu, inst, cost = _cost(prepared, result, trace.prfaas_instance_s, trace.pd_instance_s, prices)
    return Outcome(
        "elastic",
        trace.prfaas_instance_s / duration,
        trace.pd_instance_s / duration,
        summary,
        gpu,
        inst,
        cost,
        trace,
    )


def peak_sizes(
    prepared: Prepared,
    window_s: float = 600.0,
    prices: tuple[float, float, float] = EXAMPLE_PRICES,
    max_prfaas: int = 8,
    max_pd: int = 16,
) -> tuple[int, int]:
    """The planner's cheapest (PrFaaS, PD) for each ``window_s`` of the day (its rate, its mix), elementwise max:
    the static deployment sized for the peak."""
    base = prepared.planned.inputs
    base = replace(
        base,
        prfaas_hardware=replace(base.prfaas_hardware, price_per_instance_hour=prices[0]),
        pd_hardware=replace(base.pd_hardware, price_per_instance_hour=prices[1]),
    )
    duration = prepared.scenario.duration_seconds
    n_prf = n_pd = 0
    start = 0.0
    while start < duration:
        end = min(duration, start + window_s)
        reqs = [r for r in prepared.requests if start <= r.arrival_s < end]
        rate = len(reqs) / (end - start)
        start = end
        if len(reqs) < 20:
            continue
        inputs: PlanInputs = replace(
            base,
            lengths=EmpiricalDistribution.from_lengths(max(1, r.uncached_tokens) for r in reqs),
            output_tokens=sum(r.output_tokens for r in reqs) / len(reqs),
            arrival_rate_per_second=rate,
        )
        best = cheapest_for_rate(inputs, rate, prices[2], max_prfaas, max_pd)
        if best is None:
            return max_prfaas, max_pd
        pt = best.point
        n_prf, n_pd = max(n_prf, pt.n_prfaas), max(n_pd, pt.n_prefill + pt.n_decode)
    return max(1, n_prf), max(2, n_pd)


def neighbourhood(peak: tuple[int, int], prfaas: tuple[int, int], pd: tuple[int, int]) -> list[tuple[int, int]]:
    """The peak sizes ±1 on each axis, within ``prfaas`` and ``pd`` (min, max)."""
    out = []
    for a in (peak[0] - 1, peak[0], peak[0] + 1):
        for b in (peak[1] - 1, peak[1], peak[1] + 1):
            if prfaas[0] <= a <= prfaas[1] and pd[0] <= b <= pd[1]:
                out.append((a, b))
    return out


def elastic_params(spec: SimElasticSpec) -> ElasticParams:
    """The loops' bounds and behaviour from the scenario's ``elastic`` block (the ``scaling`` block's meanings)."""
    behavior = ScaleBehavior(
        tolerance=spec.tolerance,
        scale_down_window_s=spec.scale_down_stabilization_seconds,
        startup_s=spec.startup_seconds,
    )
    return ElasticParams(
        ScaleBounds(spec.prfaas_min_instances, spec.prfaas_max_instances),
        ScaleBounds(spec.pd_min_instances, spec.pd_max_instances),
        behavior,
        period_s=spec.period_seconds,
        target_utilization=spec.target_utilization,
    )


def prices(spec: SimElasticSpec) -> tuple[float, float, float]:
    return spec.prfaas_price_per_instance_hour, spec.pd_price_per_instance_hour, spec.link_price_per_gb


def best_static(outcomes: Iterable[Outcome], objective: float) -> Outcome | None:
    """The fewest GPU-hours among the runs whose attainment meets ``objective``."""
    ok = [o for o in outcomes if o.attainment >= objective]
    return min(ok, key=lambda o: (o.gpu_hours, -o.attainment)) if ok else None


def compare(
    prepared: Prepared,
    params: ElasticParams | None = None,
    candidates: list[tuple[int, int]] | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[tuple[int, int], list[Outcome], Outcome]:
    """(the planner's peak sizes, the static runs, the elastic run)."""
    spec = prepared.scenario.elastic
    params = params or elastic_params(spec)
    cost = prices(spec)
    peak = peak_sizes(prepared, prices=cost, max_prfaas=params.prfaas.max_instances, max_pd=params.pd.max_instances)
    bounds = (params.prfaas.min_instances, params.prfaas.max_instances)
    pd_bounds = (params.pd.min_instances, params.pd.max_instances)
    runs: dict[tuple[int, int], Outcome] = {}

    def static(n_prf: int, n_pd: int) -> Outcome:
        if (n_prf, n_pd) not in runs:
            if progress is not None:
                progress(f"static {n_prf} PrFaaS + {n_pd} PD")
            runs[(n_prf, n_pd)] = run_static(prepared, n_prf, n_pd, cost)
        return runs[(n_prf, n_pd)]

    for n in candidates if candidates is not None else neighbourhood(peak, bounds, pd_bounds):
        static(*n)
    objective = prepared.scenario.search.attainment
    best = best_static(runs.values(), objective)
    inputs = prepared.planned.inputs
    gpus = (inputs.prfaas_hardware.gpus_per_instance, inputs.pd_hardware.gpus_per_instance)
    while candidates is None and best is not None:  # the planner's peak may be more than needed: walk down
        n_prf, n_pd = int(best.n_prfaas), int(best.n_pd)
        # one instance fewer, or one of a kind traded for two of the other: every move to fewer GPUs (a trade finds
        # the static that serves the night's long prompts from the site and the day's decode with fewer PD)
        moves = [(n_prf - 1, n_pd), (n_prf, n_pd - 1), (n_prf + 1, n_pd - 2), (n_prf - 2, n_pd + 1)]
        here = n_prf * gpus[0] + n_pd * gpus[1]
        smaller = [
            (a, b)
            for a, b in moves
            if bounds[0] <= a <= bounds[1] and pd_bounds[0] <= b <= pd_bounds[1] and a * gpus[0] + b * gpus[1] < here
        ]
        tried = [static(a, b) for a, b in smaller]
        ok = best_static(tried, objective)
        if ok is None:
            break
        best = ok
    statics = list(runs.values())
    if progress is not None:
        progress("elastic")
    elastic = run_elastic(prepared, peak, params, cost)
    return peak, statics, elastic
