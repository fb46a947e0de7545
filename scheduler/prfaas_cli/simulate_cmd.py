"""``prfaas simulate [SCENARIO]``: run the discrete-event simulator on a scenario (YAML; default: the paper's
case study) and compare homogeneous PD, naive heterogeneous PD, PrFaaS-PD with a static ``t`` and PrFaaS-PD
with both timescales live, on the same arrival sequence.

Reports throughput (highest rate without unbounded queues) and goodput (highest rate at which 90 % of the
requests meet the TTFT and decode SLOs), both found by search; TTFT percentiles, TPOT, egress (mean and
peak over 1-s windows) against the link's cap, offload fraction, role flips and utilisation per stage at
the scenario's own rates. ``--plot-dir`` writes PNGs (TTFT CDF, egress vs cap, roles and ``t`` over time).
``--elastic`` compares elastic capacity with the best static deployment instead (:mod:`.simulate_elastic`).
``--write-trace FILE`` writes the scenario's request sequence as a JSONL trace and exits. ``-`` reads the
scenario from standard input. A progress bar is drawn on stderr only when it is a terminal. A fleet scenario (a
``fleet:`` block: several PrFaaS sites and PD regions) compares fleet routing with static pairing per phase instead
(:mod:`.simulate_fleet`). Exit 0 ok, 1 invalid input or a failure (nothing written on invalid input), 2 usage.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from prfaas_core.request.trace import TraceError, TraceRecord, dump_trace, parse_trace
from prfaas_core.schema.validation import validation_message
from prfaas_core.sim.arrivals import to_trace_records
from prfaas_core.sim.deployments import ScenarioError, static_split_configs
from prfaas_core.sim.fleet_config import FleetScenario
from prfaas_core.sim.report import comparison_to_dict, render_table
from prfaas_core.sim.scenario import Scenario, default_scenario
from prfaas_core.sim.search import (
    Comparison,
    DeploymentReport,
    Prepared,
    evaluate,
    prepare,
    quick,
    static_split_report,
)
from prfaas_local.formats import yaml_error
from prfaas_local.manifests import STDIN, InputError, read_input
from prfaas_local.plots import PlotDirError, check_plot_dir, figure, png, write_plots

from .output import EXIT_OK, STRUCTURED, UsageError, add_output_arg, emit, error, fail, is_terminal, os_error
from .simulate_elastic import run_elastic
from .simulate_fleet import run_fleet_cli


class SimulateCliError(Exception):
    """Bad input: the message names the file and the field. Exit code 1."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate deployments side by side (queues, bursts, prefix caches, link contention, live policies)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("scenario", nargs="?", metavar="SCENARIO", help="scenario file (YAML); default: case study")
    add_output_arg(p, "table")
    p.add_argument("--plot-dir", metavar="DIR", help="write PNG plots here")
    p.add_argument("--seed", type=int, metavar="N", help="override the scenario's seed")
    p.add_argument("--quick", action="store_true", help="shorter runs and a coarser search")
    p.add_argument("--no-search", action="store_true", help="reference runs only (no throughput/goodput search)")
    p.add_argument("--jobs", "-j", type=int, metavar="N", help="worker processes (default: CPUs)")
    p.add_argument("--write-trace", metavar="FILE", help="write the scenario's requests as a JSONL trace and exit")
    p.add_argument(
        "--elastic",
        action="store_true",
        help="elastic capacity against the planner's static sizes for the peak (as elastic.enabled: true)",
    )
    p.set_defaults(handler=run)


# --- inputs ------------------------------------------------------------------------------------------------


def load_scenario(path_text: str | None) -> tuple[Scenario, Path | None]:
    scenario, path = load_any(path_text)
    if isinstance(scenario, FleetScenario):
        raise SimulateCliError(f"{path_text}: a fleet scenario (fleet:), not a single-pair one")
    return scenario, path


def load_any(path_text: str | None) -> tuple[Scenario | FleetScenario, Path | None]:
    if path_text is None:
        return default_scenario(), None
    try:
        source, text = read_input(path_text, "scenario file")
    except InputError as exc:
        raise SimulateCliError(str(exc)) from None
    path = Path(path_text) if path_text != STDIN else None
    try:
        body = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SimulateCliError(yaml_error(source, exc)) from None
    if body is not None and not isinstance(body, dict):
        raise SimulateCliError(f"{source}: a scenario is a YAML mapping")
    try:
        if isinstance(body, dict) and "fleet" in body:
            return FleetScenario.model_validate(body), path
        return Scenario.model_validate(body or {}), path
    except ValidationError as exc:
        raise SimulateCliError(validation_message(source, exc)) from None


def load_trace(scenario: Scenario, scenario_path: Path | None) -> tuple[TraceRecord, ...] | None:
    ref = scenario.arrivals.trace_file
    if scenario.arrivals.process != "trace" or ref is None:
        return None
    base = scenario_path.parent if scenario_path is not None else Path.cwd()
    path = Path(ref) if Path(ref).is_absolute() else base / ref
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SimulateCliError(
            os_error(f"{scenario_path or '<stdin>'}: arrivals.traceFile: cannot read {path}", exc)
        ) from None
    except UnicodeDecodeError:
        raise SimulateCliError(f"{scenario_path or '<stdin>'}: arrivals.traceFile: {path} is not UTF-8 text") from None
    try:
        return parse_trace(text.splitlines(), source=str(path))
    except TraceError as exc:
        raise SimulateCliError(str(exc)) from None


# --- running ---------------------------------------------------------------------------------------------


class ProgressBar:
    """A one-line progress bar on stderr (redrawn at most every 0.2 s)."""

    def __init__(self, total_label: str, stream: Any = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.label = total_label
        self.parts: dict[str, float] = {}
        self.started = time.monotonic()
        self._drawn = -1.0
        self._last = 0.0

    def update(self, label: str, fraction: float) -> None:
        self.parts[label] = fraction
        self.draw()

    def draw(self, force: bool = False) -> None:
        now = time.monotonic()
        done = sum(self.parts.values()) / max(len(self.parts), 1)
        if not force and (now - self._last < 0.2 or abs(done - self._drawn) < 0.005):
            return
        self._drawn, self._last = done, now
        width = 30
        filled = int(width * done)
        bar = "#" * filled + "." * (width - filled)
        self.stream.write(f"\r{self.label} [{bar}] {done:5.1%} {now - self.started:5.0f} s")
        self.stream.flush()

    def close(self) -> None:
        self.draw(force=True)
        self.stream.write("\n")
        self.stream.flush()


_QUEUE: Any = None


def _worker_init(q: Any) -> None:
    global _QUEUE
    _QUEUE = q


def _worker(
    scenario: Scenario, trace: tuple[TraceRecord, ...] | None, kind: str, key: str | int, search: bool
) -> tuple[str, str | int, DeploymentReport]:
    prepared = prepare(scenario, trace)
    label = f"{kind}:{key}"

    def progress(_: str, fraction: float) -> None:
        if _QUEUE is not None:
            _QUEUE.put((label, fraction))

    return kind, key, _evaluate(prepared, kind, key, search, progress)


def _evaluate(prepared: Prepared, kind: str, key: str | int, search: bool, progress: Any) -> DeploymentReport:
    if kind == "deployment":
        return evaluate(prepared, str(key), progress, search)
    cfg = static_split_configs(prepared.scenario, prepared.planned.inputs)[int(key)]
    return evaluate(prepared, cfg.name, progress, search, config=cfg, to_completion=False)


def run_comparison(
    prepared: Prepared, trace: tuple[TraceRecord, ...] | None, search: bool, jobs: int, bar: ProgressBar | None
) -> Comparison:
    """Every deployment (and static split) as an independent task, in worker processes when ``jobs > 1``."""
    sc = prepared.scenario
    tasks: list[tuple[str, str | int]] = [("deployment", name) for name in sc.deployments]
    if sc.search.compare_static_splits:
        tasks += [("split", n) for n in sorted(static_split_configs(sc, prepared.planned.inputs))]
        if "prfaas_pd" not in sc.deployments:
            tasks.append(("deployment", "prfaas_pd"))
    results: dict[tuple[str, str | int], DeploymentReport] = {}
    for kind, key in tasks:
        if bar is not None:
            bar.update(f"{kind}:{key}", 0.0)
    if jobs <= 1 or len(tasks) == 1:
        for kind, key in tasks:
            label = f"{kind}:{key}"

            def progress(_: str, fraction: float, label: str = label) -> None:
                if bar is not None:
                    bar.update(label, fraction)

            results[(kind, key)] = _evaluate(prepared, kind, key, search, progress)
            if bar is not None:
                bar.update(label, 1.0)
    else:
        ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
        q = ctx.Queue()
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_worker_init, initargs=(q,)) as pool:
            pending: set[Future[tuple[str, str | int, DeploymentReport]]] = {
                pool.submit(_worker, sc, trace, kind, key, search) for kind, key in tasks
            }
            while pending:
                finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                _drain(q, bar)
                for fut in finished:
                    kind, key, rep = fut.result()
                    results[(kind, key)] = rep
                    if bar is not None:
                        bar.update(f"{kind}:{key}", 1.0)
            _drain(q, bar)
    deployments: dict[str, DeploymentReport] = {name: results[("deployment", name)] for name in sc.deployments}
    static = None
    if sc.search.compare_static_splits:
        splits = {int(k): rep for (kind, k), rep in results.items() if kind == "split"}
        static = static_split_report(splits, results[("deployment", "prfaas_pd")])
    return Comparison(prepared, deployments, static)


def _drain(q: Any, bar: ProgressBar | None) -> None:
    while True:
        try:
            label, fraction = q.get_nowait()
        except queue.Empty:
            return
        if bar is not None:
            bar.update(label, fraction)


# --- plots ------------------------------------------------------------------------------------------------


def render_plots(c: Comparison) -> dict[str, bytes]:
    """TTFT CDF per deployment; egress per second against the cap; PD roles and ``t`` over time."""
    out: dict[str, bytes] = {}
    reps = c.deployments
    sc = c.prepared.scenario

    fig = figure(7, 4.5)
    ax = fig.add_subplot()
    for name, rep in reps.items():
        xs = sorted(rep.result.ttft_s)
        if xs:
            ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=name)
    ax.set_xscale("log")
    ax.set(xlabel="TTFT (s)", ylabel="fraction of requests", title=f"TTFT CDF at the scenario's rates ({sc.name})")
    ax.grid(True, which="both", lw=0.3)
    ax.legend(fontsize=8)
    out["ttft-cdf.png"] = png(fig)

    fig = figure(8, 4.5)
    ax = fig.add_subplot()
    cap_drawn = False
    for name, rep in reps.items():
        ser = rep.result.series
        if rep.config.n_prfaas == 0 or not ser.time_s:
            continue
        ax.plot(ser.time_s, ser.egress_gbps, lw=0.7, label=f"{name} egress")
        if not cap_drawn:
            cap = [g * sc.link.max_utilization for g in ser.capacity_gbps]
            ax.plot(ser.time_s, cap, "k--", lw=1.0, label="cap (capacity × maxUtilization)")
            ax.plot(ser.time_s, ser.capacity_gbps, "k:", lw=0.8, label="link capacity")
            cap_drawn = True
    ax.set(xlabel="simulated time (s)", ylabel="Gbps over 1-s windows", title="PrFaaS -> PD egress against the cap")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    out["egress.png"] = png(fig)

    fig = figure(8, 6)
    ax, ax2 = fig.subplots(2, 1, sharex=True)
    for name, rep in reps.items():
        ser = rep.result.series
        if rep.config.routing != "threshold" or not ser.time_s:
            continue
        ax.step(
            ser.time_s, ser.n_prefill, where="post", label=f"{name}: prefill (decode = {sc.cluster.pd_instances} − it)"
        )
        ax2.step(ser.time_s, [t / 1000 for t in ser.threshold_tokens], where="post", lw=0.8, label=f"{name}: t")
    ax.set(ylabel="PD prefill instances", title="PD roles and the threshold t over time")
    ax.set_ylim(0, sc.cluster.pd_instances)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=7)
    ax2.set(xlabel="simulated time (s)", ylabel="threshold t (K tokens)")
    ax2.legend(fontsize=7)
    out["roles-threshold.png"] = png(fig)
    return out


# --- entry point --------------------------------------------------------------------------------------------


def _run_fleet(scn: FleetScenario, args: argparse.Namespace) -> int:
    if args.seed is not None:
        if args.seed < 0:
            raise UsageError(f"--seed: must be ≥ 0, got {args.seed}")
        scn = scn.model_copy(update={"seed": args.seed})
    if args.elastic or args.write_trace:
        raise UsageError("--elastic and --write-trace: not for a fleet scenario")
    plot_dir = check_plot_dir(args.plot_dir) if args.plot_dir else None
    return run_fleet_cli(scn, args.output, plot_dir, args.quick)


def run(args: argparse.Namespace) -> int:
    try:
        loaded, path = load_any(args.scenario)
        if isinstance(loaded, FleetScenario):
            return _run_fleet(loaded, args)
        scenario = loaded
        if args.seed is not None:
            if args.seed < 0:
                raise UsageError(f"--seed: must be ≥ 0, got {args.seed}")
            scenario = scenario.model_copy(update={"seed": args.seed})
        if args.quick:
            scenario = quick(scenario)
        if args.jobs is not None and args.jobs < 1:
            raise UsageError(f"--jobs: must be ≥ 1, got {args.jobs}")
        plot_dir = check_plot_dir(args.plot_dir) if args.plot_dir else None
        trace = load_trace(scenario, path)
        source = str(path) if path is not None else "case study"
        try:
            prepared = prepare(scenario, trace)
        except ScenarioError as exc:
            raise SimulateCliError(f"{source}: {exc}") from None
    except (SimulateCliError, PlotDirError, UsageError) as exc:
        return fail(exc)
    if args.write_trace:
        try:
            Path(args.write_trace).write_text(dump_trace(to_trace_records(prepared.requests)), encoding="utf-8")
        except OSError as exc:
            return error(os_error(f"--write-trace {args.write_trace}", exc))
        print(f"wrote {len(prepared.requests)} requests to {args.write_trace}", file=sys.stderr)
        return 0
    if args.elastic or scenario.elastic.enabled:
        return run_elastic(prepared, args.output, plot_dir)
    search = not args.no_search and scenario.search.enabled
    n_tasks = len(scenario.deployments) + (8 if scenario.search.compare_static_splits else 0)
    jobs = args.jobs if args.jobs is not None else max(1, min(os.cpu_count() or 1, n_tasks))
    bar = ProgressBar(f"simulate {scenario.name}") if is_terminal(sys.stderr) else None
    comparison = run_comparison(prepared, trace, search, jobs, bar)
    if bar is not None:
        bar.close()
    images = render_plots(comparison) if plot_dir is not None else {}
    if args.output in STRUCTURED:
        emit(comparison_to_dict(comparison), args.output)
    else:
        print(render_table(comparison))
    if plot_dir is not None:
        try:
            write_plots(plot_dir, images)
        except PlotDirError as exc:
            return fail(exc)
    return EXIT_OK
