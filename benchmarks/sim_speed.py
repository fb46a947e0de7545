"""Simulator speed: one simulated hour of the paper's case study, one deployment, one rate.

Prints simulated events per second and wall time for the production policies (``prfaas_pd``: routing,
admission, link state and the threshold policy every simulated second, the role loop every period) side by
side with a baseline in which every policy call is replaced by a fixed-``t`` rule (remote iff the uncached
length exceeds the planner's ``t``, least-queued instance, no link state, no threshold updates, no role
loop) — the difference is what the policies cost. Target (issue 4): ≤ 5 s wall for the hour.

    .venv/bin/python benchmarks/sim_speed.py [--rate 3.0] [--deployment prfaas_pd] [--repeat 3] [--smoke]

The baseline is a parameter of the simulation (``Simulation(..., policy=FIXED_T)``), not a patch.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from prfaas_core.capacity.kv import KvModel
from prfaas_core.policy.link_state import LinkMode, LinkParams, LinkState
from prfaas_core.policy.routing import (
    InstancePick,
    InstanceView,
    RouteDecision,
    RouteRequest,
    RoutingView,
    transfer_bytes,
)
from prfaas_core.policy.short_term import ShortTermPolicy
from prfaas_core.policy.threshold import ThresholdBounds, ThresholdDecision
from prfaas_core.sim.arrivals import generate_requests
from prfaas_core.sim.deployments import plan_deployments
from prfaas_core.sim.scenario import default_scenario
from prfaas_core.sim.simulation import Simulation

HOUR_S = 3600.0
Seconds = Callable[[float], float]


def _fixed_route(
    req: RouteRequest, view: RoutingView, kv: KvModel, prfaas_seconds: Seconds, pd_seconds: Seconds | None
) -> RouteDecision:
    uncached = req.total_tokens - req.pd_cached_tokens
    if uncached > view.threshold_tokens:
        return RouteDecision(
            "remote", uncached, transfer_bytes(kv, req.total_tokens, req.pd_cached_tokens), 0.0, "fixed t"
        )
    return RouteDecision("local", uncached, 0.0, 0.0, "fixed t")


def _least_queued(views: Sequence[InstanceView], total: int = 0, seconds: Seconds | None = None) -> InstancePick:
    best = min(views, key=lambda v: (v.queued_prefill_s, v.active_decodes, v.name))
    return InstancePick(best.name, 0.0, "")


def _t_min(
    mode: LinkMode, bounds: ThresholdBounds, lengths: Sequence[int], window_s: float, kv: KvModel, link: LinkParams
) -> ThresholdDecision:
    return ThresholdDecision(bounds.min_tokens, 0, "fixed")


def _keep(prev: LinkState, egress_gbps: float, params: LinkParams, now_s: float) -> LinkState:
    return prev


FIXED_T = ShortTermPolicy(
    route=_fixed_route, pick_prefill=_least_queued, pick_decode=_least_queued, threshold=_t_min, link_state=_keep
)
"""The baseline: remote iff the uncached length exceeds the planner's ``t``, least-queued instances, no link
state, no threshold updates."""


def run_once(deployment: str, rate: float, baseline: bool, seconds: float = HOUR_S) -> tuple[float, int, int]:
    sc = default_scenario()
    requests = generate_requests(sc.arrivals, sc.workload, seconds, sc.seed, rate / sc.arrivals.rate_per_second)
    planned = plan_deployments(sc, requests)
    config = planned.configs[deployment]
    if baseline:
        config = replace(config, live_threshold=False, live_roles=False)
    sim = Simulation(config, requests, seconds, FIXED_T if baseline else ShortTermPolicy())
    start = time.perf_counter()
    result = sim.run(until_s=seconds)
    return time.perf_counter() - start, result.events, len(requests)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=3.0, help="arrival rate, req/s (default 3.0)")
    ap.add_argument("--deployment", default="prfaas_pd", help="deployment (default prfaas_pd)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per variant; the fastest counts (default 3)")
    ap.add_argument("--seconds", type=float, default=HOUR_S, help="simulated seconds (default one hour)")
    ap.add_argument("--smoke", action="store_true", help="the real code path on a tiny input (60 s, one run each)")
    args = ap.parse_args()
    if args.smoke:
        args.seconds, args.repeat = 60.0, 1
    rows = []
    for label, baseline in (("production policies", False), ("fixed-t baseline", True)):
        best = min(run_once(args.deployment, args.rate, baseline, args.seconds) for _ in range(args.repeat))
        wall, events, n = best
        rows.append((label, wall, events, n))
    print(f"{args.seconds:g} simulated seconds of the case study: {args.deployment} at {args.rate:g} req/s")
    print(f"{'variant':<22} {'wall (s)':>9} {'events':>9} {'events/s':>10} {'requests':>9} {'sim s / wall s':>15}")
    for label, wall, events, n in rows:
        print(f"{label:<22} {wall:9.2f} {events:9d} {events / wall:10.0f} {n:9d} {args.seconds / wall:15.0f}")
    prod, base = rows[0][1], rows[1][1]
    hour = f"per simulated hour: {(prod - base) * HOUR_S / args.seconds:.2f} s"
    print(f"policies cost {prod - base:.2f} s ({hour}, {prod / base:.2f}× the baseline); target ≤ 5 s an hour")


if __name__ == "__main__":
    main()
