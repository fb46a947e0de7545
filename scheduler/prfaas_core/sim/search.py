"""Rate searches and the side-by-side comparison of a scenario's deployments.

A *probe* replays the scenario's sequence at ``m`` × its rates (same seed: common random numbers) for the
search duration, then summarises it. Two searches per deployment, each a bracket then a bisection on ``m``
down to ``relativePrecision``:

* **throughput** — the highest rate whose queues stay bounded (:mod:`.metrics`), starting from the
  planner's ``Λ_max`` for that deployment;
* **goodput** (DistServe) — the highest rate at which at least ``attainment`` (90 %) of the requests meet
  both the TTFT and the decode SLO.

Rates are reported as mean arrival rates (``m`` × the sequence's mean rate). :func:`prepare` fixes the
sequence and sizes the deployments; :func:`evaluate` runs one deployment (a reference run at the scenario's
own rate plus the two searches) — independent per deployment, so a shell may run them in parallel;
:func:`compare` runs them all.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..capacity.planner import Plan
from ..request.trace import TraceRecord
from .arrivals import Curve, SimRequest, generate_requests, requests_from_trace
from .config import SimConfig
from .deployments import PlannedDeployments, ScenarioError, plan_deployments, static_split_configs
from .metrics import RunSummary, summarize
from .results import RunResult
from .scenario import Scenario
from .simulation import Simulation

ProgressFn = Callable[[str, float], None]
"""``progress(label, fraction of this deployment's work done)``."""

GRACE_S = 300.0
"""After a probe's arrivals stop, queues drain this long; what is unfinished then has missed its SLO."""


@dataclass(frozen=True)
class Probe:
    multiplier: float
    rate_rps: float
    stable: bool
    attainment: float
    growing_stage: str | None
    prefill_end: int
    """PD prefill instances at the end of the probe (the role loop may have moved them)."""
    decode_end: int


@dataclass
class DeploymentReport:
    name: str
    config: SimConfig
    planner_rps: float
    planner_binding: str
    reference: RunSummary
    """At the scenario's own rates, over its whole duration, run until every request finished."""
    result: RunResult
    throughput_rps: float | None = None
    throughput_stage: str | None = None
    """The stage whose queue grew at the lowest unstable rate probed."""
    goodput_rps: float | None = None
    probes: list[Probe] = field(default_factory=list)


@dataclass(frozen=True)
class Prepared:
    """A scenario's fixed request sequence (at its own rates) and its planned deployments."""

    scenario: Scenario
    requests: tuple[SimRequest, ...]
    planned: PlannedDeployments
    mean_rate_rps: float
    """Mean arrival rate of the sequence at multiplier 1."""
    trace: tuple[TraceRecord, ...] | None

    @property
    def plan(self) -> Plan:
        return self.planned.plan

    @property
    def link_cap_gbps(self) -> float:
        link = self.scenario.link
        return link.capacity_gbps * link.max_utilization

    def requests_at(self, multiplier: float, duration_s: float) -> tuple[SimRequest, ...]:
        sc = self.scenario
        if self.trace is not None:
            return tuple(r for r in requests_from_trace(self.trace, multiplier) if r.arrival_s <= duration_s)
        if multiplier == 1.0 and duration_s == sc.duration_seconds:
            return self.requests
        return generate_requests(sc.arrivals, sc.workload, duration_s, sc.seed, multiplier)

    def search_duration_s(self) -> float:
        """A probe lasts the search duration, stretched to whole periods of a periodic rate curve."""
        sc = self.scenario
        d = sc.search.duration_seconds
        period = _period(sc)
        if period is not None:
            d = max(d, period) if d < period else math.ceil(d / period) * period
        if self.trace is not None:
            d = min(d, sc.duration_seconds)
        return d

    def shift_s(self, duration_s: float) -> float:
        """Length of the two windows the stability check compares (whole periods when periodic)."""
        period = _period(self.scenario)
        usable = 0.9 * duration_s
        if period is not None and period <= usable / 2:
            return math.floor(usable / 2 / period) * period
        return usable / 2


def _period(sc: Scenario) -> float | None:
    curves = [sc.arrivals.rate_curve, *(w.weight_curve for w in sc.workload)]
    periods = [c.period_seconds for c in curves if c is not None and c.period_seconds is not None]
    return max(periods) if periods else None


def prepare(scenario: Scenario, trace: Sequence[TraceRecord] | None = None) -> Prepared:
    """Generate (or take) the sequence and plan every deployment. Raises :class:`ScenarioError`."""
    if scenario.arrivals.process == "trace":
        if not trace:
            raise ScenarioError("arrivals.traceFile: a trace scenario needs the trace's records")
        records = tuple(trace)
        span = records[-1].arrival_s
        if span <= 0:
            raise ScenarioError("arrivals.traceFile: the trace spans no time")
        scenario = scenario.model_copy(update={"duration_seconds": min(scenario.duration_seconds, span)})
        requests = requests_from_trace(records)
        mean_rate = len(requests) / span
    else:
        records = None
        requests = generate_requests(scenario.arrivals, scenario.workload, scenario.duration_seconds, scenario.seed)
        mean_rate = _mean_rate(scenario)
    planned = plan_deployments(scenario, requests)
    return Prepared(scenario, requests, planned, mean_rate, records)


def _mean_rate(sc: Scenario) -> float:
    """The intensity's mean over the duration at multiplier 1 (bursts at their long-run average)."""
    curve = Curve(sc.arrivals.rate_curve)
    n = max(1, math.ceil(sc.duration_seconds))
    step = sc.duration_seconds / n
    mean_curve = sum(curve((k + 0.5) * step) for k in range(n)) / n
    burst = 1.0
    if sc.arrivals.process == "bursty":
        b = sc.arrivals.burst
        total = b.mean_high_seconds + b.mean_low_seconds
        burst = (b.high_multiplier * b.mean_high_seconds + b.low_multiplier * b.mean_low_seconds) / total
    return sc.arrivals.rate_per_second * mean_curve * burst


def run_config(
    prepared: Prepared,
    config: SimConfig,
    multiplier: float,
    duration_s: float,
    until_s: float | None = None,
    progress: Callable[[float], None] | None = None,
) -> tuple[RunResult, RunSummary, tuple[SimRequest, ...]]:
    """One run of ``config`` at ``multiplier`` over ``duration_s`` (to ``until_s``; default: to completion)."""
    requests = prepared.requests_at(multiplier, duration_s)
    result = Simulation(config, requests, duration_s).run(until_s, progress)
    sc = prepared.scenario
    warmup = min(0.1 * duration_s, 120.0)
    summary = summarize(
        result, [r.arrival_s for r in requests], warmup, prepared.shift_s(duration_s), sc.search.max_queue_growth
    )
    return result, summary, requests


def _bisect(
    pred: Callable[[float], bool],
    start: float,
    rel: float,
    known: Sequence[tuple[float, bool]] = (),
    max_steps: int = 40,
) -> float:
    """Largest ``m`` with ``pred(m)`` (monotone: true below, false above), to relative width ``rel``.

    ``known`` outcomes (from earlier probes) seed the bracket; otherwise it grows from ``start`` in steps
    of 1.25×."""
    passed = [m for m, ok in known if ok]
    failed = [m for m, ok in known if not ok]
    lo = max(passed, default=0.0)
    hi = min((m for m in failed if m > lo), default=math.inf)
    m = (
        start
        if lo == 0.0 and hi == math.inf
        else (lo * 1.25 if hi == math.inf else (hi / 1.25 if lo == 0 else 0.5 * (lo + hi)))
    )
    for _ in range(max_steps):
        if hi < math.inf and lo > 0.0 and hi - lo <= rel * hi:
            break
        if pred(m):
            lo = m
        else:
            hi = m
        if hi == math.inf:
            m = lo * 1.25
        elif lo == 0.0:
            m = hi / 1.25
            if m < start * 1e-3:
                return 0.0
        else:
            m = 0.5 * (lo + hi)
    return lo


def evaluate(
    prepared: Prepared,
    name: str,
    progress: ProgressFn | None = None,
    search: bool = True,
    config: SimConfig | None = None,
    goodput: bool = True,
    to_completion: bool = True,
) -> DeploymentReport:
    """The reference run of one deployment and (unless ``search`` is false) its rate searches (throughput,
    then goodput unless ``goodput`` is false). The reference run lasts until every request has finished, or
    (``to_completion`` false) :data:`GRACE_S` after the last arrival, the rest counting as SLO misses."""
    sc = prepared.scenario
    cfg = config if config is not None else prepared.planned.configs[name]
    planned_rps = prepared.planned.planner_rps.get(name, math.nan)
    binding = prepared.planned.planner_binding.get(name, "")
    budget = 1.0 + (12 if search else 0)
    done = [0.0]

    def tick(fraction: float) -> None:
        if progress is not None:
            progress(name, min(1.0, (done[0] + fraction) / budget))

    until = None if to_completion else sc.duration_seconds + GRACE_S
    result, summary, _ = run_config(prepared, cfg, 1.0, sc.duration_seconds, until, tick)
    done[0] += 1.0
    report = DeploymentReport(name, cfg, planned_rps, binding, summary, result)
    if not search:
        tick(0.0)
        return report
    duration = prepared.search_duration_s()
    cache: dict[float, Probe] = {}

    def probe(m: float) -> Probe:
        key = round(m, 9)
        if key not in cache:
            r, s, _ = run_config(prepared, cfg, m, duration, duration + GRACE_S)
            ser = r.series
            cache[key] = Probe(
                m,
                m * prepared.mean_rate_rps,
                s.stable,
                s.slo_attainment,
                s.growing_stage,
                ser.n_prefill[-1] if ser.n_prefill else cfg.n_prefill,
                ser.n_decode[-1] if ser.n_decode else cfg.n_decode,
            )
            report.probes.append(cache[key])
            done[0] = min(budget - 0.5, done[0] + 1.0)
            tick(0.0)
        return cache[key]

    rel = sc.search.relative_precision
    start = planned_rps / prepared.mean_rate_rps if planned_rps > 0 and math.isfinite(planned_rps) else 1.0
    m_thr = _bisect(lambda m: probe(m).stable, start, rel)
    unstable = sorted((p for p in report.probes if not p.stable), key=lambda p: p.multiplier)
    report.throughput_rps = m_thr * prepared.mean_rate_rps
    report.throughput_stage = unstable[0].growing_stage if unstable else None
    if not goodput:
        tick(1.0)
        return report
    target = sc.search.attainment
    known = [(p.multiplier, p.attainment >= target) for p in report.probes]
    m_good = _bisect(lambda m: probe(m).attainment >= target, max(m_thr, 0.05) * 0.8, rel, known)
    report.goodput_rps = m_good * prepared.mean_rate_rps
    done[0] = budget - 1.0
    tick(1.0)
    return report


@dataclass
class StaticSplitReport:
    """``prfaas_pd`` with each fixed prefill count vs the live role loop, at the scenario's own rates."""

    attainment: dict[int, float]
    goodput_rps: dict[int, float]
    best_prefill: int
    live_attainment: float
    live_goodput_rps: float | None


def static_split_report(splits: dict[int, DeploymentReport], live: DeploymentReport) -> StaticSplitReport:
    """The best fixed split (by goodput when searched, else by SLO attainment) against the live loop."""
    attainment = {n: r.reference.slo_attainment for n, r in splits.items()}
    goodput = {n: r.goodput_rps for n, r in splits.items() if r.goodput_rps is not None}
    score = goodput if goodput else attainment
    best = max(score, key=lambda n: (score[n], -n))
    return StaticSplitReport(attainment, goodput, best, live.reference.slo_attainment, live.goodput_rps)


def compare_static_splits(
    prepared: Prepared, live: DeploymentReport | None = None, progress: ProgressFn | None = None, search: bool = True
) -> StaticSplitReport:
    """Every fixed split on the same sequence against ``prfaas_pd`` (see :func:`static_split_configs`)."""
    configs = static_split_configs(prepared.scenario, prepared.planned.inputs)
    splits: dict[int, DeploymentReport] = {}
    for k, (n_p, cfg) in enumerate(sorted(configs.items())):
        splits[n_p] = evaluate(prepared, cfg.name, None, search, config=cfg, to_completion=False)
        if progress is not None:
            progress("static splits", (k + 1) / len(configs))
    if live is None:
        live = evaluate(prepared, "prfaas_pd", None, search)
    return static_split_report(splits, live)


@dataclass
class Comparison:
    prepared: Prepared
    deployments: dict[str, DeploymentReport]
    static_splits: StaticSplitReport | None = None


def compare(
    scenario: Scenario,
    trace: Sequence[TraceRecord] | None = None,
    progress: ProgressFn | None = None,
    search: bool = True,
) -> Comparison:
    """Every deployment of the scenario on the same sequence (sequentially; see :func:`evaluate`)."""
    prepared = prepare(scenario, trace)
    search = search and scenario.search.enabled
    reports: dict[str, DeploymentReport] = {
        name: evaluate(prepared, name, progress, search) for name in scenario.deployments
    }
    static = None
    if scenario.search.compare_static_splits:
        static = compare_static_splits(prepared, reports.get("prfaas_pd"), progress, search)
    return Comparison(prepared, reports, static)


def quick(scenario: Scenario) -> Scenario:
    """A coarser, shorter variant (``--quick``; tests): at most 20 simulated minutes per run (whole periods
    of a periodic curve), probes of 10 minutes, 6 % precision."""
    s = scenario.search
    search = s.model_copy(
        update={
            "duration_seconds": min(s.duration_seconds, 600.0),
            "relative_precision": max(0.06, s.relative_precision),
        }
    )
    duration = min(scenario.duration_seconds, 1200.0)
    period = _period(scenario)
    if period is not None:
        duration = max(duration, min(scenario.duration_seconds, period))
    return scenario.model_copy(update={"duration_seconds": duration, "search": search})
