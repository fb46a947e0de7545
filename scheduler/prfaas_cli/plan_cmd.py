"""``prfaas plan [FILES...]``: size a PrFaaS deployment — threshold ``t``, the P/D split, link egress — with
the paper's throughput model (Eqs. 1–8), and compare it with homogeneous PD and naive heterogeneous PD.

With no FILES it plans the paper's case study (4×H200 PrFaaS, 8×H20 PD, 100 Gbps, the internal 1T model).
With FILES (YAML manifests or directories) it validates them like ``prfaas validate`` and plans the one
ModelProfile, PrefillCluster, PDCluster and InterDCLink they hold. ``--workload`` takes a WorkloadSpec
(YAML) or a trace (JSONL, see ``prfaas_core.request.trace``); ``-`` reads either from standard input.
``--budget X`` (the most throughput whose cost per hour fits X) and ``--cheapest-for-rate R`` size the PrFaaS site
and the PD cluster together instead (cost = instances x pricePerInstanceHour + link GB x ``--link-price-per-gb``).
FILES holding a fleet (several PD clusters, sites or links: every region's files at once) plan the fleet
instead (``prfaas_cli.plan_fleet``): each PD cluster's ``t`` and split, what it sends over each link to each site,
what binds and where added capacity pays most; ``--demand PD=RPS`` gives each PD cluster's demand.
Exit 0 ok, 1 invalid input, nothing that fits (a fleet: a --demand that does not fit) or a failure (nothing
written on invalid input), 2 usage.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from prfaas_core.api import InterDCLinkSpec, ModelProfileSpec, PDClusterSpec, PrefillClusterSpec
from prfaas_core.capacity.hardware import HardwareProfile, list_builtin_hardware
from prfaas_core.capacity.plan_inputs import case_study_specs
from prfaas_core.capacity.planner import (
    Deployment,
    Plan,
    PlanInputs,
    plan,
    plan_inputs_from_specs,
    sweep_splits,
    sweep_thresholds,
)
from prfaas_core.capacity.workload import WorkloadSpec, mean, workload_from_trace
from prfaas_core.names import K_TOKENS
from prfaas_core.request.trace import TraceError, parse_trace
from prfaas_core.schema.validation import Checked, validate_documents, validation_message
from prfaas_local.formats import yaml_error
from prfaas_local.manifests import STDIN, InputError, load_documents, read_input
from prfaas_local.plots import PlotDirError, check_plot_dir, figure, png, write_plots

from . import plan_budget, plan_fleet
from .output import EXIT_ERROR, EXIT_OK, STRUCTURED, UsageError, add_output_arg, emit, fail

KINDS_NEEDED = ("ModelProfile", "PrefillCluster", "PDCluster", "InterDCLink")


class PlanCliError(Exception):
    """Bad input: the message names the file and the field. Exit code 1."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="size a PrFaaS deployment (threshold, P/D split, link) and compare with the baselines",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("files", nargs="*", metavar="FILE", help="manifest files or directories (default: case study)")
    p.add_argument(
        "--workload",
        metavar="FILE",
        help="workload: a WorkloadSpec (.yaml/.yml) or a trace (.jsonl); default: the paper's case-study workload",
    )
    add_output_arg(p, "table")
    p.add_argument("--plot-dir", metavar="DIR", help="write Fig. 5-style PNGs (Λ_max vs N_p, Λ_max vs t) here")
    p.add_argument("--link-gbps", type=float, metavar="X", help="override the link capacity, Gbps")
    p.add_argument(
        "--homogeneous-instances", type=int, metavar="N", help="PD-hardware instances of the homogeneous baseline"
    )
    p.add_argument("--list-hardware", action="store_true", help="list the built-in hardware profiles and exit")
    plan_budget.add_arguments(p)
    plan_fleet.add_arguments(p)
    p.set_defaults(handler=run)


def run_fleet(args: argparse.Namespace) -> int | None:
    """FILES holding a fleet (several PD clusters, sites or links): its plan; None when they hold one pair."""
    try:
        found = plan_fleet.models(_checked(args.files))
        if not plan_fleet.is_fleet(found):
            if args.demand:
                raise UsageError("--demand: plans a fleet (several PD clusters, sites or links); use --workload")
            return None
        if plan_budget.wanted(args) or args.plot_dir or args.link_gbps is not None or args.homogeneous_instances:
            raise UsageError("a fleet's plan takes --workload, --demand and -o only")
        workload = load_workload(args.workload) if args.workload else WorkloadSpec()
        result = plan_fleet.solve(found, workload, args)
    except (PlanCliError, InputError, UsageError, plan_fleet.FleetInputError) as exc:
        return fail(exc)
    if args.output in STRUCTURED:
        emit(plan_fleet.to_dict(result), args.output)
    else:
        print(plan_fleet.render(result))
    return EXIT_OK if result.multiplier >= 1.0 or not args.demand else EXIT_ERROR


def run(args: argparse.Namespace) -> int:
    if args.list_hardware:
        _print_hardware(args.output)
        return 0
    if args.files and (fleet := run_fleet(args)) is not None:
        return fleet
    if plan_budget.wanted(args):
        try:
            inputs = build_inputs(args)
            inputs, found = plan_budget.solve(args, inputs)
        except (PlanCliError, InputError, plan_budget.BudgetError, plan_budget.MissingPrices) as exc:
            return fail(exc)
        if args.output in STRUCTURED:
            emit(plan_budget.to_dict(args, inputs, found), args.output)
        else:
            print(plan_budget.render(args, inputs, found))
        return EXIT_OK if found is not None else EXIT_ERROR
    try:
        inputs = build_inputs(args)
        result = plan(inputs)
        plot_dir = check_plot_dir(args.plot_dir, create=True) if args.plot_dir else None
        images = render_plots(inputs, result) if plot_dir is not None else {}
    except (PlanCliError, InputError, PlotDirError, UsageError) as exc:
        return fail(exc)
    if args.output in STRUCTURED:
        emit(plan_to_dict(inputs, result), args.output)
    else:
        print(render_table(inputs, result))
    if plot_dir is not None:
        try:
            write_plots(plot_dir, images)
        except PlotDirError as exc:
            return fail(exc)
    return EXIT_OK


# --- Inputs ------------------------------------------------------------------------------------------------


def load_workload(path_text: str) -> WorkloadSpec:
    """A WorkloadSpec from YAML, or one derived from a JSONL trace."""
    try:
        source, text = read_input(path_text, "workload file")
    except InputError as exc:
        raise PlanCliError(str(exc)) from None
    first = text.lstrip()[:1]
    if Path(path_text).suffix == ".jsonl" or (path_text == STDIN and first == "{"):
        try:
            return workload_from_trace(parse_trace(text.splitlines(), source=source))
        except TraceError as exc:
            raise PlanCliError(str(exc)) from None
    try:
        body = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PlanCliError(yaml_error(source, exc)) from None
    try:
        return WorkloadSpec.model_validate(body if body is not None else {})
    except ValidationError as exc:
        raise PlanCliError(validation_message(source, exc)) from None


def _checked(files: list[str]) -> list[Checked]:
    checked = validate_documents(load_documents(files))
    bad = [c for c in checked if not c.ok]
    if bad:
        lines = [f"{c.document.label}: {issue}" for c in bad for issue in c.issues]
        raise PlanCliError("invalid manifests:\n  " + "\n  ".join(lines))
    return checked


def _specs_from_files(files: list[str]) -> tuple[ModelProfileSpec, PrefillClusterSpec, PDClusterSpec, InterDCLinkSpec]:
    checked = _checked(files)
    found: dict[str, list[tuple[str, BaseModel]]] = {k: [] for k in KINDS_NEEDED}
    for c in checked:
        if c.skipped is None and c.model is not None and c.document.kind in found:
            found[c.document.kind].append((c.document.label, c.model))
    prefill = found["PrefillCluster"]
    if len(prefill) == 2 and {getattr(m, "spec").mode for _, m in prefill} == {"Managed", "Remote"}:  # noqa: B009
        # both regions given: region A runs it (Managed), region B describes it (Remote); plan from B's view
        managed, remote = sorted(prefill, key=lambda o: getattr(o[1], "spec").mode)  # noqa: B009
        m_spec, r_spec = getattr(managed[1], "spec"), getattr(remote[1], "spec")  # noqa: B009
        if (m_spec.instances, m_spec.hardware) != (r_spec.instances, r_spec.hardware):
            raise PlanCliError(
                f"{managed[0]} and {remote[0]} describe the same PrefillCluster with different instances or "
                "hardware; make region B's description match region A"
            )
        found["PrefillCluster"] = [remote]
    for kind, objs in found.items():
        if len(objs) != 1:
            where = ", ".join(label for label, _ in objs) or "none found"
            raise PlanCliError(
                f"{' '.join(files)}: need exactly one {kind}, found {len(objs)} ({where}); pass one region's view"
            )
    specs = {kind: getattr(objs[0][1], "spec") for kind, objs in found.items()}  # noqa: B009
    return specs["ModelProfile"], specs["PrefillCluster"], specs["PDCluster"], specs["InterDCLink"]


def build_inputs(args: argparse.Namespace) -> PlanInputs:
    """Case study or manifests, the workload, and the command-line overrides."""
    if args.files:
        profile, prefill, pd, link = _specs_from_files(args.files)
        workload = WorkloadSpec()
    else:
        profile, prefill, pd, link, workload = case_study_specs()
    if args.workload:
        workload = load_workload(args.workload)
    if args.link_gbps is not None and not (args.link_gbps > 0 and math.isfinite(args.link_gbps)):
        raise UsageError(f"--link-gbps: must be a positive number of Gbps, got {args.link_gbps}")
    try:
        inputs = plan_inputs_from_specs(profile, prefill, pd, link, workload, args.homogeneous_instances)
    except ValueError as exc:
        source = " ".join(args.files) if args.files else "case study"
        raise PlanCliError(f"{source}: {exc}") from None
    if args.link_gbps is not None:
        inputs = replace(inputs, link_capacity_gbps=args.link_gbps)
    return inputs


# --- Output ------------------------------------------------------------------------------------------------


def _num(x: float | None, digits: int = 4) -> float | None:
    if x is None or math.isnan(x) or math.isinf(x):
        return None
    return round(x, digits)


def deployment_to_dict(d: Deployment) -> dict[str, Any]:
    pt, s = d.point, d.point.split
    offloads = pt.n_prfaas > 0 and s.offload_fraction > 0
    return {
        "throughput_rps": _num(pt.throughput_rps),
        "n_prfaas": pt.n_prfaas,
        "n_prefill": pt.n_prefill,
        "n_decode": pt.n_decode,
        "ttft_mean_s": _num(d.ttft_mean_s),
        "ttft_p90_s": _num(d.ttft_p90_s),
        "theta_prfaas": _num(pt.theta_prfaas),
        "theta_prfaas_compute": _num(pt.theta_prfaas_compute) if offloads else None,
        "theta_prfaas_egress": _num(pt.theta_prfaas_egress) if offloads else None,
        "theta_pd_p": _num(pt.theta_pd_p),
        "theta_pd_d": _num(pt.theta_pd_d),
        "offload_fraction": _num(s.offload_fraction),
        "egress_gbps": _num(pt.egress_gbps),
        "binding": pt.binding,
        "reason": d.reason,
        "cost_per_hour": _num(d.cost_per_hour),
        "requests_per_cost_unit": _num(d.throughput_per_cost),
    }


def plan_to_dict(inputs: PlanInputs, result: Plan) -> dict[str, Any]:
    """The plan as JSON-ready data (``--output json``)."""
    prfaas = deployment_to_dict(result.prfaas_pd)
    s = result.prfaas_pd.point.split
    prfaas.update(
        threshold_tokens=round(s.threshold_tokens),
        l_long_tokens=round(s.l_long_tokens),
        l_short_tokens=round(s.l_short_tokens),
        threshold_balanced_tokens=result.threshold_balanced_tokens,
        threshold_bandwidth_floor_tokens=result.threshold_bandwidth_floor_tokens,
        link_utilization=_num(result.prfaas_pd.point.egress_gbps / inputs.link_capacity_gbps),
    )
    ratios = {}
    for d in (result.prfaas_pd, result.homogeneous_pd, result.naive_heterogeneous):
        base = result.homogeneous_pd
        ratios[d.name] = {
            "throughput": _num(result.throughput_ratio(d)),
            "ttft_mean": _num(d.ttft_mean_s / base.ttft_mean_s),
            "ttft_p90": _num(d.ttft_p90_s / base.ttft_p90_s),
            "equal_cost_throughput": _num(result.equal_cost_ratio(d)),
        }
    out: dict[str, Any] = {
        "prfaas_pd": prfaas,
        "homogeneous_pd": deployment_to_dict(result.homogeneous_pd),
        "naive_heterogeneous": deployment_to_dict(result.naive_heterogeneous),
        "ratios_vs_homogeneous": ratios,
        "inputs": {
            "model": inputs.model_name,
            "prfaas_hardware": inputs.prfaas_hardware.accelerator,
            "pd_hardware": inputs.pd_hardware.accelerator,
            "n_prfaas": inputs.n_prfaas,
            "n_pd": inputs.n_pd,
            "homogeneous_instances": inputs.homogeneous_count,
            "link_capacity_gbps": inputs.link_capacity_gbps,
            "link_max_utilization": inputs.link_max_utilization,
            "usable_egress_gbps": _num(inputs.usable_egress_gbps),
            "mean_input_tokens": _num(mean(inputs.lengths), 1),
            "output_tokens": inputs.output_tokens,
        },
        "reason": result.reason,
    }
    if result.target is not None:
        t = result.target
        out["at_arrival_rate"] = {
            "arrival_rate_per_second": _num(t.arrival_rate_per_second),
            "feasible": t.feasible,
            "utilization": _num(t.utilization),
            "egress_gbps": _num(t.egress_gbps),
            "link_utilization": _num(t.link_utilization),
            "threshold_bandwidth_floor_tokens": t.threshold_bandwidth_floor_tokens,
            "reason": t.reason,
        }
    return out


def render_table(inputs: PlanInputs, result: Plan) -> str:
    """A readable, aligned comparison like the paper's Table 6."""
    ds = (result.prfaas_pd, result.homogeneous_pd, result.naive_heterogeneous)
    dash = "—"

    def counts(d: Deployment) -> str:
        pt = d.point
        return " / ".join(str(n) if n else dash for n in (pt.n_prfaas, pt.n_prefill, pt.n_decode))

    def thetas(d: Deployment) -> str:
        pt = d.point
        vals = (pt.theta_prfaas if pt.n_prfaas else None, pt.theta_pd_p if pt.n_prefill else None, pt.theta_pd_d)
        return " / ".join(f"{v:.2f}" if v is not None else dash for v in vals)

    def cost(d: Deployment) -> str:
        ratio = result.equal_cost_ratio(d)
        return f"{d.cost_per_hour:.2f}/h ({ratio:.2f}×)" if d.cost_per_hour is not None and ratio else dash

    pf = result.prfaas_pd.point
    rows = [
        ("", "PrFaaS-PD", "Homogeneous PD", "Naive heterogeneous"),
        ("Threshold t (tokens)", f"{pf.split.threshold_tokens:.0f}", dash, dash),
        ("N_prfaas / N_p / N_d", *(counts(d) for d in ds)),
        ("Offload fraction p", *(f"{d.point.split.offload_fraction:.1%}" for d in ds)),
        ("l_long / l_short (tokens)", f"{pf.split.l_long_tokens:.0f} / {pf.split.l_short_tokens:.0f}", dash, dash),
        ("Θ_prfaas / Θ_pd-p / Θ_pd-d", *(thetas(d) for d in ds)),
        ("Λ_max (req/s)", *(f"{d.point.throughput_rps:.2f}" for d in ds)),
        ("Ratio vs homogeneous", *(f"{result.throughput_ratio(d):.2f}×" for d in ds)),
        ("Mean / P90 TTFT (s)", *(f"{d.ttft_mean_s:.2f} / {d.ttft_p90_s:.2f}" for d in ds)),
        ("Egress (Gbps)", *(f"{d.point.egress_gbps:.1f}" if d.point.n_prfaas else dash for d in ds)),
        ("Binding constraint", *(d.point.binding for d in ds)),
        ("Cost (equal-cost ratio)", *(cost(d) for d in ds)),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [
        f"Model {inputs.model_name or '?'}: PrFaaS {inputs.n_prfaas} × {inputs.prfaas_hardware.accelerator}, "
        f"PD {inputs.n_pd} × {inputs.pd_hardware.accelerator}, link {inputs.link_capacity_gbps:g} Gbps "
        f"(usable {inputs.usable_egress_gbps:g} at cap {inputs.link_max_utilization:g}); "
        f"mean input {mean(inputs.lengths):.0f} tokens, output {inputs.output_tokens:g} tokens",
        "",
    ]
    for i, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[j]) for j, cell in enumerate(row)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines += ["", f"PrFaaS-PD: {result.prfaas_pd.reason}.", f"Summary: {result.reason}."]
    if result.target is not None:
        lines.append(
            f"At {result.target.arrival_rate_per_second:.2f} req/s: {result.target.reason}; egress "
            f"{result.target.egress_gbps:.1f} Gbps ({result.target.link_utilization:.0%} of the link)."
        )
    return "\n".join(lines)


def _print_hardware(output: str) -> None:
    profiles = list_builtin_hardware()
    lengths = (1, 8, 32, 128)

    def row(p: HardwareProfile) -> dict[str, Any]:
        return {
            "accelerator": p.accelerator,
            "gpus_per_instance": p.gpus_per_instance,
            "prefill_seconds": {f"{k}K": round(p.prefill_seconds(k * K_TOKENS), 3) for k in lengths},
            "decode_tokens_per_second": p.decode.tokens_per_second if p.decode else None,
            "description": p.description,
        }

    rows = [row(p) for p in profiles]
    if output in STRUCTURED:
        emit(rows, output)
        return
    for r in rows:
        times = ", ".join(f"{k} {v:.2f} s" for k, v in r["prefill_seconds"].items())
        print(f"{r['accelerator']:<6} prefill {times}; decode {r['decode_tokens_per_second']:g} tok/s")
        print(f"       {r['description']}")


# --- Plots (paper Fig. 5) ----------------------------------------------------------------------------------


def render_plots(inputs: PlanInputs, result: Plan) -> dict[str, bytes]:
    """Fig. 5(a) Λ_max vs N_p at the chosen t, and 5(b) Λ_max vs t at the chosen split, as PNG bytes."""
    best = result.prfaas_pd.point
    t_star = best.split.threshold_tokens
    out: dict[str, bytes] = {}

    fig = figure(6, 4)
    ax = fig.add_subplot()
    points = sweep_splits(inputs, t_star)
    xs = [pt.n_prefill for pt in points]
    ax.plot(xs, [pt.throughput_rps for pt in points], "o-", color="black", label="Λ_max")
    ax.plot(
        xs,
        [min(pt.prfaas_rate, pt.pd_prefill_rate) for pt in points],
        "--",
        label="prefill min(Θ_prfaas/p, Θ_pd-p/(1−p))",
    )
    ax.plot(xs, [pt.theta_pd_d for pt in points], ":", label="decode Θ_pd-d")
    ax.axvline(best.n_prefill, color="grey", lw=0.8)
    ax.set(
        xlabel=f"N_p (N_d = {inputs.n_pd} − N_p)", ylabel="req/s", title=f"(a) Λ_max vs N_p at t = {t_star:.0f} tokens"
    )
    ax.legend(fontsize=8)
    out["fig5a-lambda-vs-np.png"] = png(fig, dpi=120)

    fig = figure(6, 4)
    ax = fig.add_subplot()
    hi = inputs.lengths.support()[1]
    top = min(hi, max(60 * K_TOKENS, 3 * t_star))
    ts = [top * i / 300 for i in range(1, 301)]
    sweep = sweep_thresholds(inputs, best.n_prefill, best.n_decode, ts)
    cap = 3 * max(best.throughput_rps, 1e-9)
    kt = [t / 1000 for t in ts]
    ax.plot(kt, [min(pt.prfaas_rate, cap) for pt in sweep], label="Θ_prfaas / p")
    ax.plot(kt, [min(pt.pd_prefill_rate, cap) for pt in sweep], label="Θ_pd-p / (1 − p)")
    ax.plot(kt, [pt.theta_pd_d for pt in sweep], ":", label="Θ_pd-d")
    ax.plot(kt, [pt.throughput_rps for pt in sweep], color="black", lw=2, label="Λ_max")
    ax.axvline(t_star / 1000, color="grey", lw=0.8)
    ax.set(
        xlabel="threshold t (thousand tokens)",
        ylabel="req/s",
        ylim=(0, cap),
        title=f"(b) Λ_max vs t at {best.n_prefill}P/{best.n_decode}D",
    )
    ax.legend(fontsize=8)
    out["fig5b-lambda-vs-threshold.png"] = png(fig, dpi=120)
    return out
