"""Simulator speed: one simulated hour of the paper's case study, one deployment, one rate.

Prints simulated events per second and wall time for the production policies (``prfaas_pd``: routing,
admission, link state and the threshold policy every simulated second, the role loop every period) side by
side with a baseline in which every policy call is replaced by a fixed-``t`` rule (remote iff the uncached
length exceeds the planner's ``t``, least-queued instance, no link state, no threshold updates, no role
loop) — the difference is what the policies cost. Target (issue 4): ≤ 5 s wall for the hour.

    .venv/bin/python benchmarks/sim_speed.py [--rate 3.0] [--deployment prfaas_pd] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import prfaas_core.sim.simulation as engine
from prfaas_core.policy.routing import InstancePick, RouteDecision, RouteRequest, RoutingView
from prfaas_core.policy.threshold import ThresholdDecision
from prfaas_core.sim.arrivals import generate_requests
from prfaas_core.sim.deployments import plan_deployments
from prfaas_core.sim.scenario import default_scenario

HOUR_S = 3600.0


def _fixed_route(req: RouteRequest, view: RoutingView, kv: Any, seconds: Any) -> RouteDecision:
    uncached = req.total_tokens - req.pd_cached_tokens
    if uncached > view.threshold_tokens:
        nbytes = engine.transfer_bytes(kv, req.total_tokens, req.pd_cached_tokens)
        return RouteDecision("remote", uncached, nbytes, 0.0, "fixed t")
    return RouteDecision("local", uncached, 0.0, 0.0, "fixed t")


def _least_queued(views: Any, total: int = 0, seconds: Any = None) -> InstancePick:
    best = min(views, key=lambda v: (v.queued_prefill_s, v.active_decodes, v.name))
    return InstancePick(best.name, 0.0, "")


@contextmanager
def fixed_rule() -> Iterator[None]:
    """Swap the engine's policy calls for the fixed-``t`` baseline (restored afterwards)."""
    saved = {n: getattr(engine, n) for n in ("decide_route", "pick_prefill_instance", "pick_decode_instance")}
    saved["decide_threshold"] = engine.decide_threshold
    saved["next_link_state"] = engine.next_link_state
    engine.decide_route = _fixed_route  # type: ignore[assignment]
    engine.pick_prefill_instance = _least_queued  # type: ignore[assignment]
    engine.pick_decode_instance = _least_queued  # type: ignore[assignment]
    engine.decide_threshold = lambda mode, bounds, *a: ThresholdDecision(bounds.min_tokens, 0, "fixed")  # type: ignore[assignment]
    engine.next_link_state = lambda prev, *a: prev  # type: ignore[assignment]
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(engine, name, fn)


def run_once(deployment: str, rate: float, baseline: bool) -> tuple[float, int, int]:
    sc = default_scenario()
    requests = generate_requests(sc.arrivals, sc.workload, HOUR_S, sc.seed, rate / sc.arrivals.rate_per_second)
    planned = plan_deployments(sc, requests)
    config = planned.configs[deployment]
    if baseline:
        from dataclasses import replace

        config = replace(config, live_threshold=False, live_roles=False)
    sim = engine.Simulation(config, requests, HOUR_S)
    start = time.perf_counter()
    if baseline:
        with fixed_rule():
            result = sim.run(until_s=HOUR_S)
    else:
        result = sim.run(until_s=HOUR_S)
    return time.perf_counter() - start, result.events, len(requests)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=3.0, help="arrival rate, req/s (default 3.0)")
    ap.add_argument("--deployment", default="prfaas_pd", help="deployment (default prfaas_pd)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per variant; the fastest counts (default 3)")
    args = ap.parse_args()
    rows = []
    for label, baseline in (("production policies", False), ("fixed-t baseline", True)):
        best = min(run_once(args.deployment, args.rate, baseline) for _ in range(args.repeat))
        wall, events, n = best
        rows.append((label, wall, events, n))
    print(f"one simulated hour of the case study: {args.deployment} at {args.rate:g} req/s")
    print(f"{'variant':<22} {'wall (s)':>9} {'events':>9} {'events/s':>10} {'requests':>9} {'sim s / wall s':>15}")
    for label, wall, events, n in rows:
        print(f"{label:<22} {wall:9.2f} {events:9d} {events / wall:10.0f} {n:9d} {HOUR_S / wall:15.0f}")
    prod, base = rows[0][1], rows[1][1]
    print(f"policies cost {prod - base:.2f} s per simulated hour ({prod / base:.2f}× the baseline); target ≤ 5 s")


if __name__ == "__main__":
    main()
