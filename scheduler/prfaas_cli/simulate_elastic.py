"""``prfaas simulate --elastic`` (or ``elastic.enabled: true`` in the scenario): elastic capacity against the best
static deployment on the scenario's day (:mod:`prfaas_core.sim.elastic_run`): a table (or ``-o json|yaml``) of
GPU-hours, cost and SLO attainment, and with ``--plot-dir`` ``elastic-capacity.png`` (instances over time against
demand, both clusters)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from prfaas_core.sim.elastic_run import Outcome, best_static, compare
from prfaas_core.sim.search import Prepared
from prfaas_local.plots import PlotDirError, figure, png, write_plots

from .output import EXIT_OK, STRUCTURED, emit, fail


def _row(o: Outcome) -> dict[str, Any]:
    return {
        "name": o.name,
        "prfaas_instances": round(o.n_prfaas, 3),
        "pd_instances": round(o.n_pd, 3),
        "gpu_hours": round(o.gpu_hours, 2),
        "instance_hours": round(o.instance_hours, 2),
        "cost": round(o.cost, 2),
        "slo_attainment": round(o.attainment, 4),
        "ttft_p90_s": round(o.summary.ttft_p90_s, 3),
        "completed": o.summary.completed,
        "arrived": o.summary.arrived,
    }


def report(prepared: Prepared, peak: tuple[int, int], statics: list[Outcome], elastic: Outcome) -> dict[str, Any]:
    """The comparison as data: the planner's peak sizes, every static run, the best one, the elastic run, ratios."""
    objective = prepared.scenario.search.attainment
    best = best_static(statics, objective)
    out: dict[str, Any] = {
        "scenario": prepared.scenario.name,
        "objective_attainment": objective,
        "planner_peak": {"prfaas_instances": peak[0], "pd_instances": peak[1]},
        "static": [_row(o) for o in statics],
        "best_static": _row(best) if best is not None else None,
        "elastic": _row(elastic),
        "elastic_decisions": len(elastic.trace.decisions) if elastic.trace is not None else 0,
    }
    if best is not None:
        out["gpu_hours_ratio"] = round(elastic.gpu_hours / best.gpu_hours, 4)
        out["cost_ratio"] = round(elastic.cost / best.cost, 4)
    if elastic.trace is not None and elastic.trace.time_s:
        out.update(where_it_goes(elastic, prepared))
    return out


def where_it_goes(elastic: Outcome, prepared: Prepared, window_s: float = 600.0) -> dict[str, Any]:
    """Where the elastic run's instances go, per ``window_s`` of the day: each cluster's desired, ready and demand
    (the policy's own, in instances at its target utilisation) as means over the loop's samples; and the demand
    envelope's GPU-hours over the day (the demand as it was, and in whole instances per cluster within the min)."""
    tr = elastic.trace
    assert tr is not None
    inputs = prepared.planned.inputs
    g_prf, g_pd = inputs.prfaas_hardware.gpus_per_instance, inputs.pd_hardware.gpus_per_instance
    rows = []
    start = 0.0
    while start < tr.time_s[-1]:
        idx = [i for i, t in enumerate(tr.time_s) if start <= t < start + window_s]
        if idx:

            def mean(xs: list[Any], idx: list[int] = idx) -> float:
                return round(float(sum(xs[i] for i in idx)) / len(idx), 2)

            rows.append(
                {"from_s": start, "to_s": start + window_s,
                 "prfaas": {"desired": mean(tr.prfaas_desired), "ready": mean(tr.prfaas_ready),
                            "demand": mean(tr.prfaas_demand)},
                 "pd": {"desired": mean(tr.pd_desired), "ready": mean(tr.pd_ready), "demand": mean(tr.pd_demand)}}
            )  # fmt: skip
        start += window_s
    hours = prepared.scenario.duration_seconds / 3600.0
    n = len(tr.time_s)
    frac = sum(a * g_prf + b * g_pd for a, b in zip(tr.prfaas_demand, tr.pd_demand, strict=True)) / n * hours
    whole = (
        sum(
            max(1, math.ceil(a - 1e-9)) * g_prf + max(2, math.ceil(b - 1e-9)) * g_pd
            for a, b in zip(tr.prfaas_demand, tr.pd_demand, strict=True)
        )
        / n
        * hours
    )
    return {
        "per_window": rows,
        "demand_envelope_gpu_hours": round(frac, 1),
        "demand_envelope_whole_instances_gpu_hours": round(whole, 1),
    }


def render_table(rep: dict[str, Any]) -> str:
    lines = [
        f"elastic capacity vs static ({rep['scenario']}; objective: {rep['objective_attainment']:.0%} attainment; "
        f"planner's peak sizes {rep['planner_peak']['prfaas_instances']} PrFaaS + "
        f"{rep['planner_peak']['pd_instances']} PD)",
        f"{'run':<22} {'PrFaaS':>7} {'PD':>7} {'GPU-h':>8} {'cost':>9} {'attain':>7} {'TTFT p90':>9}",
    ]
    best = rep["best_static"]
    for row in [*rep["static"], rep["elastic"]]:
        mark = " *" if best is not None and row["name"] == best["name"] else ""
        lines.append(
            f"{row['name'] + mark:<22} {row['prfaas_instances']:>7.2f} {row['pd_instances']:>7.2f} "
            f"{row['gpu_hours']:>8.1f} {row['cost']:>9.1f} {row['slo_attainment']:>7.2%} {row['ttft_p90_s']:>8.2f}s"
        )
    if best is None:
        lines.append("no static run met the objective")
    else:
        lines.append(
            f"elastic / best static (*): GPU-hours x{rep['gpu_hours_ratio']:.3f}, cost x{rep['cost_ratio']:.3f} "
            "(elastic sizes are time averages)"
        )
    rows = rep.get("per_window") or []
    if rows:
        lines.append("where the elastic instances go (means per window; demand = the policy's, in instances):")
        lines.append(f"{'window s':<13} {'PrFaaS desired/ready/demand':>28} {'PD desired/ready/demand':>26}")
        for r in rows:
            a, b = r["prfaas"], r["pd"]
            lines.append(
                f"{r['from_s']:5.0f}-{r['to_s']:<6.0f} {a['desired']:>10.2f} {a['ready']:>7.2f} {a['demand']:>8.2f} "
                f"{b['desired']:>10.2f} {b['ready']:>6.2f} {b['demand']:>8.2f}"
            )
        lines.append(
            f"demand envelope: {rep['demand_envelope_gpu_hours']:.1f} GPU-hours as demanded, "
            f"{rep['demand_envelope_whole_instances_gpu_hours']:.1f} in whole instances per cluster"
        )
    return "\n".join(lines)


def render_plot(elastic: Outcome, title: str) -> bytes:
    """Instances (desired and ready) over time against demand (instances), PrFaaS above, PD below."""
    tr = elastic.trace
    assert tr is not None
    fig = figure(9, 6)
    axes = fig.subplots(2, 1, sharex=True)
    hours = [t / 3600 for t in tr.time_s]
    for ax, label, desired, ready, demand in (
        (axes[0], "PrFaaS site", tr.prfaas_desired, tr.prfaas_ready, tr.prfaas_demand),
        (axes[1], "PD cluster", tr.pd_desired, tr.pd_ready, tr.pd_demand),
    ):
        ax.plot(hours, demand, lw=0.8, color="tab:gray", label="demand (instances, at target utilisation)")
        ax.step(hours, desired, where="post", lw=1.2, label="desired")
        ax.step(hours, ready, where="post", lw=1.0, ls="--", label="ready")
        ax.set(ylabel=f"{label} instances")
        ax.set_ylim(bottom=0)
        ax.grid(True, lw=0.3)
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_title(title)
    axes[1].set(xlabel="simulated time (h)")
    return png(fig)


def run_elastic(prepared: Prepared, output: str, plot_dir: Path | None) -> int:
    def progress(what: str) -> None:
        print(f"simulate --elastic: {what}", file=sys.stderr, flush=True)

    peak, statics, elastic = compare(prepared, progress=progress)
    rep = report(prepared, peak, statics, elastic)
    if output in STRUCTURED:
        emit(rep, output)
    else:
        print(render_table(rep))
    if plot_dir is not None:
        title = f"Elastic capacity on {prepared.scenario.name}: instances against demand"
        try:
            write_plots(plot_dir, {"elastic-capacity.png": render_plot(elastic, title)})
        except PlotDirError as exc:
            return fail(exc)
    return EXIT_OK
