"""``prfaas up``: the whole system on one machine, no cluster — emulated PrFaaS engines behind the prefill
gateway, PD engines, the shaped link (KV bytes really cross it), the router, and the core's long-term loop
with a local observer and actuator (the operator plugs in Kubernetes ones); then replays traffic (the paper's
input lengths, Poisson arrivals at a fraction of the planner's Λ_max, time-scaled) with a live view, and
prints a summary (SLO attainment, TTFT by route, egress vs cap, role flips, t)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from prfaas_core.names import METRIC_ROUTER_THRESHOLD_TOKENS
from prfaas_core.plan_inputs import case_study_inputs
from prfaas_core.planner import plan
from prfaas_core.policy.roles import RolePolicyParams
from prfaas_core.trace import TraceRecord, parse_trace

from . import real_up
from .load import Result, Slo, prepare_bodies, replay, sample_egress, summarize
from .local_loop import LocalCluster, LocalLoop, decision_json
from .plots import PlotDirError, check_plot_dir, figure, png, write_plots
from .stack import LocalStack, StackSpec


def register(sub: Any) -> None:
    p = sub.add_parser(
        "up", help="run the whole system locally (emulated engines, link, router, loop)", description=__doc__
    )
    p.add_argument("--prfaas", type=int, help="PrFaaS (H200) engines (default 2; 1 with --engines vllm)")
    p.add_argument("--pd", type=int, help="PD (H20) engines (default 4; 2 with --engines vllm)")
    p.add_argument("--link-gbps", type=float, default=100.0, help="link capacity, model Gbps (default 100)")
    p.add_argument(
        "--load",
        type=float,
        default=0.5,
        help="arrival rate as a fraction of the planner's Λ_max (default 0.5: Λ_max is a throughput, so queues "
        "make TTFT miss its SLO well below it; the simulator puts this stack's goodput near 0.65 of it, "
        "benchmarks/goodput_vs_peers.py measures 0.5-0.57)",
    )
    p.add_argument(
        "--duration", type=float, help="model seconds of traffic (default 240; with --engines vllm: 60 wall s)"
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=2.0,
        help="model seconds per wall second (default 2: every engine, the link and the router share this "
        "machine's cores, and a faster clock turns their CPU time into model latency)",
    )
    p.add_argument(
        "--output-tokens",
        type=int,
        default=32,
        help="output tokens per request (default 32: the PD decode stage is far from its limit either way, and "
        "every streamed token costs CPU in three processes)",
    )
    p.add_argument("--trace", help="replay this trace (JSONL, prfaas_core.trace) instead of generating one")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--work-dir", help="where configs, logs and summary.json go (default: a temp dir)")
    p.add_argument("--output", "-o", choices=("table", "json"), default="table")
    p.add_argument(
        "--plot-dir", metavar="DIR", help="write up.png here: TTFT by route vs the SLO, egress vs the cap, roles and t"
    )
    real_up.register_options(p)
    p.set_defaults(handler=run)


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


def _router_threshold(url: str) -> float | None:
    """The ``t`` in force at the router (its own gauge)."""
    from prfaas_router.prom_text import sample_sum

    try:
        text = httpx.get(f"{url}/metrics", timeout=5.0).text
    except httpx.HTTPError:
        return None
    return sample_sum(text, METRIC_ROUTER_THRESHOLD_TOKENS)


def _view(
    stack: LocalStack,
    cluster: LocalCluster,
    results: list[Result],
    total: int,
    egress: list[float],
    cap: float,
    start: float,
) -> str:
    p, d = cluster.counts()
    done = len(results)
    routes: dict[str, int] = {}
    for r in results:
        routes[r.route] = routes.get(r.route, 0) + 1
    last = cluster.decisions[-1].reason if cluster.decisions else "-"
    eg = egress[-1] if egress else 0.0
    return (
        f"[{time.perf_counter() - start:6.1f}s] roles P/D {p}/{d} | t {cluster.config.threshold_min_tokens} | "
        f"egress {eg:5.1f}/{cap:.0f} Gbps | done {done}/{total} {routes} | last: {last[:70]}"
    )


async def _run(
    args: argparse.Namespace,
    stack: LocalStack,
    records: list[TraceRecord],
    params: RolePolicyParams,
    inputs: Any,
    slo: Slo,
) -> tuple[dict[str, Any], PlotData]:
    assert stack.router_config is not None
    cluster = LocalCluster(
        stack.config_path,
        stack.router_config,
        stack.urls["gateway"] + "/status",
        router_url=stack.urls["router"],
        time_scale=stack.spec.time_scale,
    )
    loop = LocalLoop(cluster, params, inputs)
    scale = stack.spec.time_scale
    bodies = prepare_bodies(records, args.seed)
    results: list[Result] = []
    egress: list[float] = []
    timeline: list[tuple[float, int, int, int]] = []  # (model s, prefill, decode, t_min published)
    stop = asyncio.Event()
    start = time.perf_counter()
    cap = stack.spec.link_gbps * stack.spec.link_max_utilization
    tty = sys.stderr.isatty()

    async def driver() -> None:
        while not stop.is_set():
            model_now = (time.perf_counter() - start) * scale
            if model_now >= loop.next_due_s():
                try:
                    await asyncio.to_thread(loop.run_once, model_now)
                except (httpx.HTTPError, RuntimeError) as exc:
                    print(f"long-term loop: cycle failed, will retry: {exc}", file=sys.stderr)
            timeline.append((model_now, *cluster.counts(), cluster.config.threshold_min_tokens))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)

    async def viewer() -> None:
        while not stop.is_set():
            line = _view(stack, cluster, results, len(records), egress, cap, start)
            print(("\r" + line[:150].ljust(150)) if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0 if tty else 10.0)

    tasks = [
        asyncio.create_task(driver()),
        asyncio.create_task(viewer()),
        asyncio.create_task(sample_egress(stack.link_metric_urls, scale, stop, egress)),
    ]
    try:
        await replay(stack.urls["router"], records, scale, on_result=results.append, bodies=bodies)
        router_t = await asyncio.to_thread(_router_threshold, stack.urls["router"])
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        cluster.close()
    if tty:
        print(file=sys.stderr)
    summary = _summary(stack, cluster, results, egress, slo, cap, router_t, time.perf_counter() - start)
    return summary, PlotData([(r.uncached_tokens, r.ttft_s, r.route) for r in results], egress, timeline, cap)


def _summary(
    stack: LocalStack,
    cluster: LocalCluster,
    results: list[Result],
    egress: list[float],
    slo: Slo,
    cap: float,
    router_t: float | None,
    wall_s: float,
) -> dict[str, Any]:
    """The run's JSON: requests (all and by route), egress against the cap, the loop's decisions."""
    summary = summarize(results, slo)
    by_route: dict[str, dict[str, Any]] = {}
    for route in sorted({r.route for r in results}):
        sub = [r for r in results if r.route == route]
        by_route[route] = summarize(sub, slo).as_json()
    flips = [decision_json(d) for d in cluster.decisions if d.action in ("FlipToDecode", "FlipToPrefill")]
    actions: dict[str, int] = {}
    for d in cluster.decisions:
        actions[d.action] = actions.get(d.action, 0) + 1
    published = json.loads(stack.config_path.read_text())
    return {
        "requests": summary.as_json(),
        "by_route": by_route,
        "egress_mean_gbps": round(sum(egress) / len(egress), 3) if egress else 0.0,
        "egress_peak_gbps": round(max(egress), 3) if egress else 0.0,
        "link_cap_gbps": cap,
        "role_flips": flips,
        "final_roles": dict(zip(("prefill", "decode"), cluster.counts(), strict=True)),
        "threshold_tokens": cluster.config.threshold_min_tokens,
        "loop": {
            "cycles": len(cluster.decisions),
            "actions": actions,
            "published_threshold_min_tokens": published["thresholdMinTokens"],
            "router_threshold_tokens": router_t,
        },
        "wall_seconds": round(wall_s, 1),
        "last_decisions": [decision_json(d) for d in cluster.decisions[-5:]],
        "errors": sorted({f"{r.status}: {r.error}" for r in results if r.status != 200})[:5],
    }


UP_ROLE_PARAMS = RolePolicyParams(
    period_s=20.0,
    hysteresis_cycles=2,
    cooldown_s=60.0,
    drain_timeout_s=30.0,
    drain_poll_s=2.0,
    prefill_min=1,
    decode_min=1,
)
"""The long-term loop's policy in ``prfaas up`` (short periods: a local run lasts minutes)."""


def _records(args: argparse.Namespace, rate_rps: float) -> list[TraceRecord]:
    """The trace to replay: ``--trace``, or one generated at ``rate_rps`` (raises ValueError/OSError)."""
    if args.trace:
        return list(parse_trace(Path(args.trace).read_text().splitlines(), args.trace))
    return generate_trace(rate_rps, args.duration, args.output_tokens, args.seed)


def _print_summary(out: dict[str, Any], work: Path) -> None:
    """The run's summary as text."""
    r = out["requests"]
    print(
        f"requests {r['requests']}, ok {r['ok']}, within SLO {r['meets_slo']} ({r['slo_attainment']:.1%}); "
        f"TTFT p50/p90 {r['ttft_p50_s']}/{r['ttft_p90_s']} s (model)"
    )
    for route, s in out["by_route"].items():
        print(
            f"  {route:9s} {s['requests']:5d} requests, TTFT p50/p90 {s['ttft_p50_s']}/{s['ttft_p90_s']} s, "
            f"SLO {s['slo_attainment']:.1%}"
        )
    if r["slo_misses"]:
        print(f"  missed the SLO by: {r['slo_misses']}")
    print(
        f"egress mean/peak {out['egress_mean_gbps']}/{out['egress_peak_gbps']} Gbps vs cap "
        f"{out['link_cap_gbps']:g}; roles now {out['final_roles']}; t {out['threshold_tokens']}; "
        f"flips {len(out['role_flips'])}"
    )
    lp = out["loop"]
    print(
        f"long-term loop: {lp['cycles']} cycles {lp['actions']}; t_min published "
        f"{lp['published_threshold_min_tokens']}, t in force at the router {lp['router_threshold_tokens']}"
    )
    print(f"summary: {work / 'summary.json'}")


def run(args: argparse.Namespace) -> int:
    if args.engines == "vllm":
        return real_up.run(args)
    args.prfaas = 2 if args.prfaas is None else args.prfaas
    args.pd = 4 if args.pd is None else args.pd
    args.duration = 240.0 if args.duration is None else args.duration
    if args.prfaas < 1 or args.pd < 2 or args.load <= 0 or args.duration <= 0 or args.time_scale <= 0:
        print("error: need --prfaas >= 1, --pd >= 2 and positive --load, --duration, --time-scale", file=sys.stderr)
        return 2
    base = replace(
        case_study_inputs(),
        n_prfaas=args.prfaas,
        n_pd=args.pd,
        output_tokens=float(args.output_tokens),
        link_capacity_gbps=args.link_gbps,
    )
    p = plan(base)
    best = p.prfaas_pd.point
    t_best = round(best.split.threshold_tokens)
    try:
        records = _records(args, args.load * best.throughput_rps)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="prfaas-up-"))
    work.mkdir(parents=True, exist_ok=True)
    spec = StackSpec(
        n_prfaas=args.prfaas,
        n_pd=args.pd,
        initial_prefill=best.n_prefill,
        link_gbps=args.link_gbps,
        time_scale=args.time_scale,
        threshold_min_tokens=int(t_best),
    )
    print(
        f"plan for {args.prfaas} PrFaaS + {args.pd} PD: t = {t_best}, "
        f"{best.n_prefill}P/{best.n_decode}D, Λ_max {best.throughput_rps:.2f} req/s; replaying {len(records)} "
        f"requests at x{args.time_scale:g} speed; logs in {work / 'logs'}",
        file=sys.stderr,
    )
    stack = LocalStack(spec, work)
    try:
        plot_dir = check_plot_dir(args.plot_dir) if args.plot_dir else None
    except PlotDirError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        stack.start()
        run_out = asyncio.run(_run(args, stack, records, UP_ROLE_PARAMS, base, Slo()))
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
    out, plot_data = run_out
    out["plan"] = {
        "threshold_tokens": t_best,
        "n_prefill": best.n_prefill,
        "n_decode": best.n_decode,
        "throughput_rps": round(best.throughput_rps, 3),
    }
    (work / "summary.json").write_text(json.dumps(out, indent=2))
    if args.output == "json":
        print(json.dumps(out, indent=2))
    else:
        _print_summary(out, work)
    if plot_dir is not None:
        try:
            write_plots(plot_dir, {"up.png": render_plot(plot_data, Slo())})
        except PlotDirError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0


@dataclass(frozen=True)
class PlotData:
    requests: list[tuple[int, float | None, str]]
    """(uncached tokens, TTFT in model s or None, route) per request."""
    egress: list[float]
    """Model Gbps per 1-s model window."""
    timeline: list[tuple[float, int, int, int]]
    """(model s, PD prefill, PD decode, t_min published) as the loop driver saw them."""
    cap: float


def render_plot(data: PlotData, slo: Slo) -> bytes:
    """One PNG, three panels sharing nothing but the run: TTFT against the SLO by route (which requests went
    where and whether they made it), egress per model second against the cap, PD roles and ``t`` over time."""
    requests, egress, timeline, cap = data.requests, data.egress, data.timeline, data.cap
    fig = figure(8, 10)
    ax_ttft, ax_egress, ax_roles = fig.subplots(3, 1)
    for route in sorted({r for *_, r in requests}):
        pts = [(u, ttft) for u, ttft, r in requests if r == route and ttft is not None]
        if pts:
            ax_ttft.scatter([u / 1000 for u, _ in pts], [t for _, t in pts], s=8, label=route, alpha=0.7)
    top = max((u for u, _, _ in requests), default=1000)
    xs = [0.0, top / 1000]
    ax_ttft.plot(xs, [slo.ttft_limit_s(int(x * 1000)) for x in xs], "k--", lw=1, label="TTFT SLO")
    ax_ttft.set(xlabel="uncached input (K tokens)", ylabel="TTFT (model s)", title="TTFT by route against the SLO")
    ax_ttft.legend(fontsize=7)
    ax_egress.plot(range(len(egress)), egress, lw=0.8, label="egress (1-s model windows)")
    ax_egress.axhline(cap, color="k", ls="--", lw=1, label=f"cap {cap:g} Gbps")
    ax_egress.set(xlabel="model s", ylabel="Gbps", title="PrFaaS -> PD egress against the cap")
    ax_egress.set_ylim(bottom=0)
    ax_egress.legend(fontsize=7)
    if timeline:
        ts = [row[0] for row in timeline]
        ax_roles.step(ts, [row[1] for row in timeline], where="post", label="PD prefill instances")
        ax_roles.step(ts, [row[2] for row in timeline], where="post", label="PD decode instances")
        ax_t = ax_roles.twinx()
        ax_t.step(ts, [row[3] / 1000 for row in timeline], where="post", color="grey", ls=":", label="t_min")
        ax_t.set_ylabel("t_min (K tokens)")
        ax_t.set_ylim(bottom=0)
    ax_roles.set(xlabel="model s", ylabel="instances", title="Roles from the long-term loop")
    ax_roles.set_ylim(bottom=0)
    ax_roles.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return png(fig)
