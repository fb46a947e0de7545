"""``prfaas up --serve``: the stack stays up for your own client — no built-in load — until Ctrl-C or
SIGTERM. The router accepts only the served model's name (others get OpenAI's 404 ``model_not_found``), the
long-term loop keeps running on what your traffic shows, and with Prometheus installed a local one scrapes
every process (with the project's rules loaded), so your own queries and the dashboard's work against it.
What to point at is printed and written to ``endpoints.json`` in the work dir."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from .formats import STRUCTURED, render
from .stack import LocalStack
from .up_prom import LocalPrometheus, running_stack, start_prometheus
from .up_report import loop_summary, render_plot, summary
from .up_session import run_session
from .up_view import LiveView


def served_model(stack: LocalStack) -> str:
    """The model name ``prfaas up --serve`` serves: the model profile's served name, what /v1/models lists
    (the only one the router accepts)."""
    from prfaas_core.capacity.profiles import builtin_model_profiles

    return builtin_model_profiles()[stack.spec.model_profile].served_model_name or "prfaas"


def endpoints(stack: LocalStack, prom: LocalPrometheus | None) -> dict[str, Any]:
    """What a user points a client, a scraper or a browser at."""
    router, gateway = stack.urls["router"], stack.urls["gateway"]
    return {
        "model": served_model(stack),
        "openai_base_url": f"{router}/v1",
        "router_url": router,
        "router_metrics": f"{router}/metrics",
        "gateway_metrics": f"{gateway}/metrics",
        "gateway_token_file": str(stack.work_dir / "gateway-token"),
        "link_metrics": list(stack.link_metric_urls),
        "engines": {n: u for n, u in stack.urls.items() if n.startswith(("prfaas-", "pd-"))},
        "prometheus": prom.url if prom else None,
        "time_scale": stack.spec.time_scale,
        "time_note": f"engines, link and router run on model time: 1 wall second = {stack.spec.time_scale:g} "
        "model seconds; latencies in the stack's metrics are model seconds, a client measures wall seconds",
    }


def print_endpoints(info: dict[str, Any], work: Path) -> None:
    """Tell the user what to point at (``info`` from :func:`endpoints`, or the real-engine stack's, which runs no
    Prometheus and so has no ``prometheus`` key)."""
    lines = [
        f"serving model {info['model']!r}: OpenAI base URL {info['openai_base_url']}",
        f"  e.g. OpenAI(base_url={info['openai_base_url']!r}, api_key='none')",
        f"  router metrics  {info['router_metrics']}",
        f"  gateway metrics {info['gateway_metrics']} (Authorization: Bearer <{info['gateway_token_file']}>)",
    ]
    if "prometheus" in info:
        lines.append(
            "  prometheus      "
            + (info["prometheus"] or "not started (install Debian's prometheus: scripts/system-deps.sh)")
        )
    lines += [
        f"  {info['time_note']}",
        f"  endpoints.json  {work / 'endpoints.json'}; Ctrl-C stops the stack",
    ]
    print("\n".join(lines), file=sys.stderr, flush=True)


def serve(args: argparse.Namespace, up: Any, stack: LocalStack, work: Path) -> int:
    stack = LocalStack(replace(stack.spec, served_models=(served_model(stack),)), stack.work_dir)
    auto = args.prometheus == "auto"
    try:
        with running_stack(stack, lambda: start_prometheus(stack, work) if auto else None) as prom:
            info = endpoints(stack, prom)
            (work / "endpoints.json").write_text(json.dumps(info, indent=2))
            print_endpoints(info, work)
            out = asyncio.run(_serve(args, up, stack))
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    png = out.pop("_png")
    (work / "summary.json").write_text(json.dumps(out, indent=2))
    if args.plot_dir:
        Path(args.plot_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.plot_dir) / "up.png").write_bytes(png)
    if args.output in STRUCTURED:
        print(render(out, args.output), end="")
    print(f"stopped; summary: {work / 'summary.json'}", file=sys.stderr)
    return 0


async def _serve(args: argparse.Namespace, up: Any, stack: LocalStack) -> dict[str, Any]:
    from prfaas_core.api import SloSpec

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # one open-ended phase: the scenario's first, as long as the stack stays up
    phases = [replace(up.phases[0], name="serve", end_s=float("inf"), expect="your own traffic")]
    view = LiveView(SloSpec(), 0, serve=True)
    try:
        st, cluster = await run_session(
            stack, [], phases, up.params, up.inputs, args.seed, on_tick=view.update, serve_until=stop
        )
    finally:
        view.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    import time

    out = summary(st, SloSpec(), time.perf_counter() - st.started)
    out["requests"], out["by_route"] = router_requests(stack.urls["router"])
    published = json.loads(stack.config_path.read_text())
    out.update(loop_summary(st, cluster.counts(), cluster.config.threshold_min_tokens, published))
    out["_png"] = render_plot(st, SloSpec())
    return out


def router_requests(router_url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The requests your own traffic sent, as the router answered them (``--serve`` has no built-in load whose
    results the summary could count): ``(requests, by_route)`` from its ``prfaas_router_requests_total``; an
    unreachable router leaves ``requests`` null, with the error."""
    import httpx

    from prfaas_core.names import METRIC_ROUTER_REQUESTS
    from prfaas_router.state.metrics import sums_by_labels

    try:
        text = httpx.get(f"{router_url}/metrics", timeout=10).text
    except httpx.HTTPError as exc:
        return {"requests": None, "source": "router", "error": f"router metrics unreadable: {exc}"}, {}
    counts = sums_by_labels(text, {METRIC_ROUTER_REQUESTS: ("route", "outcome")}).get(METRIC_ROUTER_REQUESTS, {})
    by_outcome: dict[str, int] = {}
    by_route: dict[str, dict[str, Any]] = {}
    for (route, outcome), n in sorted(counts.items()):
        by_outcome[outcome] = by_outcome.get(outcome, 0) + int(n)
        entry = by_route.setdefault(route, {"requests": 0, "ok": 0})
        entry["requests"] += int(n)
        entry["ok"] += int(n) if outcome == "ok" else 0
    total = sum(by_outcome.values())
    requests = {
        "requests": total,
        "ok": by_outcome.get("ok", 0),
        "by_outcome": by_outcome,
        "source": "router (prfaas_router_requests_total: your own traffic; TTFT and SLO in its metrics)",
    }
    return requests, by_route


__all__ = ["endpoints", "print_endpoints", "router_requests", "serve", "served_model"]
