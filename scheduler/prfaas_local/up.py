"""What ``prfaas up`` runs (its arguments: ``prfaas_cli/up_cmd.py``): the plan for the scenario, the stack
(:mod:`.stack`), the session with its live view (:mod:`.up_session`), the local Prometheus and the report with
its pictures; ``--engines vllm`` hands over to :mod:`.real_up`, ``--serve`` to :mod:`.up_serve`. Times are model
seconds (wall seconds x the scenario's time scale) unless they say wall."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from prfaas_core import names
from prfaas_core.api import SloSpec
from prfaas_core.capacity.plan_inputs import PlanInputs, case_study_inputs
from prfaas_core.capacity.planner import plan
from prfaas_core.policy.role_types import RolePolicyParams
from prfaas_core.request.trace import TraceRecord, parse_trace
from prfaas_router.state.metrics import sums_by_labels

from . import real_up
from .dashboard_png import DASHBOARD, without_exporter
from .dashboard_png import render as render_dashboard
from .formats import STRUCTURED, os_error, render
from .plots import PlotDirError, check_plot_dir, write_plots
from .scenario import (
    DEFAULT_SCENARIO,
    Phase,
    ScenarioError,
    ScenarioSpec,
    load_scenario,
    resolve,
    single_phase,
)
from .scenario import generate_trace as scenario_trace
from .stack import LocalStack, StackSpec
from .up_elastic import ElasticRun
from .up_elastic_report import elastic_summary, settings_of
from .up_prom import LocalPrometheus, alerts_seen, running_stack, start_prometheus
from .up_report import loop_summary, print_summary, render_plot, summary
from .up_session import run_session
from .up_view import LiveView


def generate_trace(rate_rps: float, duration_s: float, output_tokens: int, seed: int) -> list[TraceRecord]:
    """Poisson arrivals, the paper's truncated log-normal input lengths, single-turn sessions."""
    rng = random.Random(seed)
    dist = case_study_inputs().lengths
    out: list[TraceRecord] = []
    t, i = 0.0, 0
    while True:
        t += rng.expovariate(rate_rps)
        if t > duration_s:
            return out
        out.append(
            TraceRecord(
                arrival_s=t,
                input_tokens=dist.sample(rng),
                output_tokens=output_tokens,
                session_id=f"s{i}",
                shared_prefix_tokens=0,
            )
        )
        i += 1


@dataclass(frozen=True)
class UpPlan:
    """What the run is: the scenario with its phases, the planner's point for it, the loop's policy."""

    scenario: ScenarioSpec
    phases: list[Phase]
    inputs: PlanInputs
    threshold_tokens: int
    n_prefill: int
    n_decode: int
    lambda_max_rps: float
    params: RolePolicyParams

    def plan_json(self) -> dict[str, Any]:
        return {
            "threshold_tokens": self.threshold_tokens,
            "n_prefill": self.n_prefill,
            "n_decode": self.n_decode,
            "throughput_rps": round(self.lambda_max_rps, 3),
        }


def check_args(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments (None: nothing)."""
    if args.prfaas < 1 or args.pd < 2:
        return "need --prfaas >= 1 and --pd >= 2"
    for name in ("load", "duration", "time_scale", "link_gbps", "output_tokens"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            return f"--{name.replace('_', '-')} must be positive"
    if args.scenario and (args.load is not None or args.duration is not None):
        return "--scenario and --load/--duration are alternatives: pick one"
    if getattr(args, "model", "tiny") != "tiny":
        return "--model picks a real model: it runs with --engines vllm (emulated engines take a scenario's profile)"
    return None


def scenario_of(args: argparse.Namespace) -> ScenarioSpec:
    """``--scenario``, one steady phase for ``--load``/``--duration``, or the default; then the overrides."""
    if args.load is not None or args.duration is not None:
        spec = single_phase(
            args.load if args.load is not None else 0.5,
            args.duration if args.duration is not None else 240.0,
            100.0,
            32,
            2.0,
        )
    else:
        spec = load_scenario(Path(args.scenario) if args.scenario else DEFAULT_SCENARIO)
    changes: dict[str, Any] = {}
    if args.link_gbps is not None:
        changes["link_gbps"] = args.link_gbps
    if args.time_scale is not None:
        changes["time_scale"] = args.time_scale
    if args.output_tokens is not None:
        changes["output_tokens"] = args.output_tokens
    return spec.model_copy(update=changes) if changes else spec


def role_params(lp: Any) -> RolePolicyParams:
    """The long-term loop's policy in ``prfaas up`` from a scenario's ``loop`` block (short periods: a local run
    lasts minutes)."""
    return RolePolicyParams(
        period_s=lp.period_seconds,
        hysteresis_cycles=lp.hysteresis_cycles,
        cooldown_s=lp.cooldown_seconds,
        drain_timeout_s=lp.drain_timeout_seconds,
        drain_poll_s=2.0,
        flip_to_decode_ratio=lp.flip_to_decode_ratio,
        flip_to_prefill_ratio=lp.flip_to_prefill_ratio,
        prefill_min=1,
        decode_min=1,
    )


def make_plan(args: argparse.Namespace, spec: ScenarioSpec) -> UpPlan:
    base = replace(
        case_study_inputs(),
        n_prfaas=args.prfaas,
        n_pd=args.pd,
        output_tokens=float(spec.output_tokens),
        link_capacity_gbps=spec.link_gbps,
    )
    best = plan(base).prfaas_pd.point
    lp = spec.loop
    params = role_params(lp)
    return UpPlan(
        spec,
        resolve(spec, base.lengths),
        base,
        round(best.split.threshold_tokens),
        best.n_prefill,
        best.n_decode,
        best.throughput_rps,
        params,
    )


def records_of(args: argparse.Namespace, up: UpPlan) -> list[TraceRecord]:
    """The trace to replay: ``--trace``, or the scenario's (raises ValueError/OSError)."""
    if args.trace:
        try:
            text = Path(args.trace).read_text()
        except OSError as exc:
            raise ValueError(os_error(f"--trace {args.trace}", exc)) from None
        return list(parse_trace(text.splitlines(), args.trace))
    return scenario_trace(up.phases, up.lambda_max_rps, up.scenario.output_tokens, args.seed)


def stack_for(args: argparse.Namespace, up: UpPlan, work: Path) -> LocalStack:
    """The stack to run (the emulated engines; other engine kinds plug in here)."""
    spec = StackSpec(
        n_prfaas=args.prfaas,
        n_pd=args.pd,
        initial_prefill=up.n_prefill,
        link_gbps=up.scenario.link_gbps,
        time_scale=up.scenario.time_scale,
        threshold_min_tokens=up.threshold_tokens,
        gateway_admission=args.link_scheduling != "off",
        egress_pacing=args.link_scheduling == "paced",
    )
    return LocalStack(spec, work)


def announce(args: argparse.Namespace, up: UpPlan, records: list[TraceRecord], work: Path) -> None:
    phases = ", ".join(f"{p.name} {p.end_s - p.start_s:g} s" for p in up.phases)
    wall = up.phases[-1].end_s / up.scenario.time_scale
    what = (
        "serving your requests" if args.serve else f"replaying {len(records)} requests ({phases}; ~{wall:.0f} s wall)"
    )
    print(
        f"plan for {args.prfaas} PrFaaS + {args.pd} PD: t = {up.threshold_tokens}, "
        f"{up.n_prefill}P/{up.n_decode}D, Λ_max {up.lambda_max_rps:.2f} req/s; {what} at "
        f"x{up.scenario.time_scale:g} speed (model s = wall s x {up.scenario.time_scale:g}); logs in {work / 'logs'}",
        file=sys.stderr,
    )


def replay_run(args: argparse.Namespace, up: UpPlan, stack: LocalStack, records: list[TraceRecord]) -> dict[str, Any]:
    """Run the scenario's replay with the live view; the summary (JSON) with the plot bytes attached."""
    slo = SloSpec()
    started_unix = time.time()
    view = LiveView(slo, len(records))
    spec = up.scenario.elastic
    sizing = None
    if spec is not None:
        settings = settings_of(spec, args.prfaas, args.pd)
        sizing = lambda cluster: ElasticRun(stack, cluster, up.inputs, settings)  # noqa: E731
    try:
        st, cluster = asyncio.run(
            run_session(stack, records, up.phases, up.params, up.inputs, args.seed, on_tick=view.update, elastic=sizing)
        )
    finally:
        view.close()
    out = summary(st, slo, time.perf_counter() - st.started)
    if spec is not None:
        out["elastic"] = elastic_summary(st, {"prfaas": args.prfaas, "pd": args.pd}, up.phases)
    out["link_scheduling"] = link_scheduling_summary(args.link_scheduling, stack)
    published = json.loads(stack.config_path.read_text())
    out.update(loop_summary(st, cluster.counts(), cluster.config.threshold_min_tokens, published))
    out["plan"] = up.plan_json()
    out["_png"] = render_plot(st, slo)
    out["_started_unix"] = started_unix
    return out


def link_scheduling_summary(mode: str, stack: LocalStack) -> dict[str, Any]:
    """``--link-scheduling`` and, when the gateway scheduled the link, what its calendar answered (by result) and
    how its pulls ended, from its own counters."""
    out: dict[str, Any] = {"mode": mode}
    if mode == "off":
        return out
    try:
        text = httpx.get(stack.urls["gateway"] + "/metrics", headers=stack.gateway_headers, timeout=5.0).text
    except httpx.HTTPError as exc:
        out["error"] = f"the gateway's /metrics: {exc.__class__.__name__}"
        return out
    sums = sums_by_labels(text, {names.METRIC_GATEWAY_ADMISSIONS: ("result",), names.METRIC_GATEWAY_PULLS: ("end",)})
    for key, name in (("admissions", names.METRIC_GATEWAY_ADMISSIONS), ("pulls", names.METRIC_GATEWAY_PULLS)):
        out[key] = {label: v for (label,), v in sums.get(name, {}).items()}
    return out


def run(args: argparse.Namespace) -> int:
    if getattr(args, "fleet", False):
        from .fleet_up import run_fleet

        return run_fleet(args)
    if args.engines == "vllm":
        if args.link_scheduling != "off":
            print("error: --link-scheduling runs with the emulated engines (their gateway, relays)", file=sys.stderr)
            return 2
        return real_up.run(args)
    args.prfaas = 2 if args.prfaas is None else args.prfaas
    args.pd = 4 if args.pd is None else args.pd
    problem = check_args(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        up = make_plan(args, scenario_of(args))
        if up.scenario.elastic is not None:
            settings_of(up.scenario.elastic, args.prfaas, args.pd)  # its bounds against the stack's sizes
        records = records_of(args, up)
        plot_dir = check_plot_dir(args.plot_dir) if args.plot_dir else None
    except (OSError, ValueError) as exc:  # ScenarioError and PlotDirError are ValueErrors
        print(f"error: {exc}", file=sys.stderr)
        return 1
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="prfaas-up-"))
    work.mkdir(parents=True, exist_ok=True)
    announce(args, up, records, work)
    if args.serve:
        from .up_serve import serve

        return serve(args, up, stack_for(args, up, work), work)
    stack = stack_for(args, up, work)
    try:
        with running_stack(stack, lambda: local_prometheus(args, stack, work)) as prom:
            out = replay_run(args, up, stack, records)
            if prom is not None:
                # every alert of the project's rules that was pending or firing during the run (a healthy run:
                # none but PrfaasOperatorMetricsMissing, as up runs the long-term loop itself, with no operator)
                out["alerts"] = alerts_seen(prom, out["_started_unix"], time.time())
            if prom is not None and plot_dir is not None:
                out["_dashboard"] = dashboard_picture(prom, out["_started_unix"], time.time())
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return report(args, out, work, plot_dir)


def local_prometheus(args: argparse.Namespace, stack: LocalStack, work: Path) -> LocalPrometheus | None:
    """The local Prometheus (``--prometheus auto`` and the binary installed), or None saying why not."""
    if args.prometheus == "off":
        return None
    try:
        prom = start_prometheus(stack, work)
    except RuntimeError as exc:  # the picture is an extra: a Prometheus too slow to start never fails the run
        print(f"local Prometheus not started ({exc}): no dashboard picture this run", file=sys.stderr)
        return None
    if prom is None:
        print(
            "no prometheus binary: no local Prometheus and no dashboard picture (scripts/system-deps.sh "
            "installs Debian's)",
            file=sys.stderr,
        )
    else:
        print(f"local Prometheus at {prom.url} (scraping every process of the stack)", file=sys.stderr)
    return prom


def dashboard_picture(prom: LocalPrometheus, start: float, end: float) -> bytes | None:
    """dashboard.png: the dashboard's panels from the local Prometheus's series (None: no dashboard file)."""
    if not DASHBOARD.is_file():
        return None
    time.sleep(2.0)  # the last scrapes after the traffic (Prometheus scrapes every second)
    # prfaas up runs the core's loop itself, with no operator: the operator's panels are left out, and said so
    doc, left_out = without_exporter(json.loads(DASHBOARD.read_text()), "operator")
    data, _ = render_dashboard(
        doc,
        prom.query_range,
        start,
        time.time(),
        "prfaas up, rendered from its local Prometheus",
        rate_interval="30s",
        note="Left out, as prfaas up runs the long-term loop itself with no operator (its flips and t_min are in "
        "up.png): " + "; ".join(left_out),
    )
    return data


def report(args: argparse.Namespace, out: dict[str, Any], work: Path, plot_dir: Path | None) -> int:
    png = out.pop("_png")
    dashboard = out.pop("_dashboard", None)
    out.pop("_started_unix", None)
    (work / "summary.json").write_text(json.dumps(out, indent=2))
    if args.output in STRUCTURED:
        print(render(out, args.output), end="")
    else:
        print_summary(out)
        print(f"summary: {work / 'summary.json'}")
    if plot_dir is not None:
        try:
            write_plots(plot_dir, {"up.png": png, **({"dashboard.png": dashboard} if dashboard else {})})
        except PlotDirError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0


__all__ = ["DEFAULT_SCENARIO", "ScenarioError", "UpPlan", "generate_trace", "make_plan", "run", "scenario_of"]
