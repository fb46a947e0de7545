"""Goodput of our router against the router a user would otherwise pick, on the same engines, link and traffic.

One local two-datacenter stack (``prfaas_local.stack.LocalStack``: 2 emulated H200 PrFaaS engines whose KV
crosses shaped link relays, 4 emulated H20 PD engines split by the planner, 3 prefill / 1 decode), and three
ways of routing the same requests over it:

* ``prfaas_pd`` — our router: remote prefill through the gateway and the link for requests longer than ``t``
  (admitted under the link's cap), local PD prefill otherwise;
* ``vllm_router_pd`` — vllm-router 0.1.17 in PD mode (``--vllm-pd-disaggregation --kv-connector nixl``, its
  default ``cache_aware`` policy) with the prefill list = the 3 local PD prefill engines AND the 2 remote
  PrFaaS engines (which advertise their link relay's KV address, so that KV crosses the link too), the decode
  list = the PD decode engine;
* ``all_local`` — our router with no remote: every prefill on the local PD prefill engines;
* ``prfaas_pd_3r2g`` (with ``--gateway-admission``) — our router as 3 replicas behind a round-robin front (the
  load client sends request ``i`` to replica ``i mod 3``), over 2 fresh gateway replicas that each start with
  cap / 2 of the link and lend each other their idle share (``gateway.admission.peers``; routers 1 and 3 on one,
  router 2 on the other). The router replicas share their PD prefill books (``prfaas router --peers``;
  ``--no-replica-sync``: each sees only its own requests' and the engines' scraped counts), and the cap must hold
  for all of them together.

Traffic: Poisson arrivals, the paper's truncated log-normal input lengths (μ 9.90, σ 1.00 on [128, 131072]),
single-turn (fresh token-id prompts: no prefix-cache hits anywhere), a few output tokens. For a given rate
every system gets the same lengths and arrival times. SLO (the simulator's): TTFT ≤ 2 s + 0.2 s per 1K
uncached tokens and ≥ 40 tokens/s decode, in *model* seconds; goodput = the highest arrival rate at which
≥ 90 % of the requests meet both. Found per system on a common grid of rates (fractions of the planner's
Λ_max): the first probe is the reference rate (TTFT and egress at that rate are compared across systems), then
the walk goes up while the SLO holds (down while it does not) until it changes, and the goodput is the 90 %
crossing interpolated linearly between the two neighbouring probes' attainments. Each probe waits for the
engines to go idle before the next. Egress: the link relays' counters summed, per 1-second model window,
against the cap (capacity × maxUtilization). For our systems each probe also records what the routers and
gateways counted (decisions by reason, link waits, gateway admissions and their waits), and every request's
figures go to ``WORK_DIR/requests.jsonl`` (route, TTFT, TPOT, its TTFT limit and why it missed).

Scale: one 2-core machine runs ~12 processes; every emulated engine turns its CPU time into model time at
``--time-scale``, so the scale is chosen low enough that the machine keeps up (the JSON reports the CPU
seconds each group of processes used in the reference probes and the machine's utilisation). Output tokens
are few because each streamed token costs CPU in three processes and the PD decode stage is far from its
limit at these rates either way (the planner's split is prefill-bound).

    .venv/bin/python benchmarks/goodput_vs_peers.py [--time-scale 3] [--probes 5] [--systems a,b,c] [--smoke]

Prints JSON and writes it to out/bench/goodput.json. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from prfaas_core import names
from prfaas_core.api import SloSpec
from prfaas_core.capacity.plan_inputs import case_study_inputs
from prfaas_core.capacity.planner import plan
from prfaas_core.request.slo import ttft_objective_s
from prfaas_core.request.trace import TraceRecord
from prfaas_local.load import Result, prepare_bodies, replay, sample_egress, summarize
from prfaas_local.local_loop import write_router_config
from prfaas_local.ports import free_port
from prfaas_local.stack import PRFAAS, LocalStack, StackSpec
from prfaas_local.up import generate_trace
from prfaas_router.state.metrics import sums_by_labels

SYSTEMS = ("prfaas_pd", "prfaas_pd_3r2g", "vllm_router_pd", "all_local")
REPLICATED = "prfaas_pd_3r2g"
"""Our router as 3 replicas behind a round-robin front (the load client's), over 2 gateway replicas that each start
with cap / 2 of the link and lend each other their idle share: routers 1 and 3 on gateway A, router 2 on gateway B."""
PACED = ("prfaas_pd", REPLICATED)
"""Our systems: with --egress-pacing they run on relays paced to cap / instances."""
BIN = Path(sys.executable).parent
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_PROXY": "*", "no_proxy": "*"}
ATTAINMENT = 0.9
COUNTED = {
    names.METRIC_ROUTER_ROUTE_DECISIONS: ("route", "reason"),
    names.METRIC_ROUTER_FALLBACKS: ("kind",),
    names.METRIC_ROUTER_LINK_WAITS: ("result",),
    names.METRIC_ROUTER_LINK_WAIT_SECONDS + "_sum": (),
    names.METRIC_ROUTER_LINK_WAIT_SECONDS + "_count": (),
    names.METRIC_GATEWAY_ADMISSIONS: ("result",),
    names.METRIC_GATEWAY_ADMISSION_WAIT_SECONDS + "_sum": (),
    names.METRIC_GATEWAY_ADMISSION_WAIT_SECONDS + "_count": (),
    names.METRIC_GATEWAY_LANE_REORDERS: (),
    names.METRIC_GATEWAY_PULLS: ("end",),
    names.METRIC_GATEWAY_PULL_HOLD_SECONDS + "_sum": (),
    names.METRIC_GATEWAY_PULL_HOLD_SECONDS + "_count": (),
    names.METRIC_ROUTER_REPLICA_SYNC: ("result",),
}
"""What our router and gateway count per probe: decisions by reason, fallbacks, link waits, admissions, pulls
reported over or leased out, how long answers were held for room on the wire, and the books router replicas sent
each other."""


def scrape(urls: list[str], headers: dict[str, str]) -> dict[str, float]:
    """The :data:`COUNTED` samples summed over ``urls`` (router and gateway ``/metrics``), keyed
    ``name{label=value,...}``; an unreachable one counts nothing."""
    out: dict[str, float] = {}
    for url in urls:
        try:
            text = httpx.get(url, headers=headers, timeout=5.0).text
        except httpx.HTTPError:
            continue
        for name, sums in sums_by_labels(text, COUNTED).items():
            for values, value in sums.items():
                label = ",".join(f"{k}={v}" for k, v in zip(COUNTED[name], values, strict=True))
                key = f"{name}{{{label}}}" if label else name
                out[key] = out.get(key, 0.0) + value
    return out


@dataclass
class Probe:
    rate_rps: float
    requests: int
    attainment: float
    passed: bool
    stopped_early: bool
    summary: dict[str, Any]
    egress_mean_gbps: float
    egress_peak_gbps: float
    wall_s: float
    cpu_s: dict[str, float]
    counted: dict[str, float]

    def as_json(self) -> dict[str, Any]:
        return {
            "rate_rps": round(self.rate_rps, 4),
            "requests": self.requests,
            "slo_attainment": round(self.attainment, 4),
            "passed": self.passed,
            "stopped_early": self.stopped_early,
            "ttft_p50_s": self.summary["ttft_p50_s"],
            "ttft_p90_s": self.summary["ttft_p90_s"],
            "routes": self.summary["routes"],
            "slo_misses": self.summary["slo_misses"],
            "slo_attainment_by_route": self.summary.get("by_route", {}),
            "egress_mean_gbps": round(self.egress_mean_gbps, 3),
            "egress_peak_gbps": round(self.egress_peak_gbps, 3),
            "wall_s": round(self.wall_s, 1),
            "router_counted": {k: round(v, 3) for k, v in sorted(self.counted.items()) if v},
        }


def base_trace(requests: int, output_tokens: int, seed: int) -> list[TraceRecord]:
    """``requests`` Poisson arrivals at 1 req/s (scaled per probe) with the paper's input lengths."""
    trace: list[TraceRecord] = []
    duration = requests * 1.5
    while len(trace) < requests:
        trace = generate_trace(1.0, duration, output_tokens, seed)
        duration *= 1.5
    return trace[:requests]


def at_rate(base: list[TraceRecord], rate: float, seconds: float, min_requests: int) -> list[TraceRecord]:
    n = min(len(base), max(min_requests, math.ceil(rate * seconds)))
    return [r.model_copy(update={"arrival_s": r.arrival_s / rate}) for r in base[:n]]


class Bench:
    def __init__(self, args: argparse.Namespace, stack: LocalStack, slo: SloSpec) -> None:
        self.args = args
        self.stack = stack
        self.slo = slo
        self.scale = stack.spec.time_scale
        self.base = base_trace(args.max_requests, args.output_tokens, args.seed)
        self.probe_seq = 0
        self.system = ""
        self.counted_urls: list[str] = []
        """Our routers' and gateways' /metrics while one of our systems is probed (counters per probe)."""
        lam = args.lambda_max
        self.grid = sorted({round(f * lam, 3) for f in args.grid} | {args.reference_rps})

    # --- the systems --------------------------------------------------------------------------------------
    def start_system(self, name: str) -> list[str]:
        """The system's front URLs (requests go round-robin over them); sets :attr:`counted_urls`."""
        st = self.stack
        self.counted_urls = []
        if name == "prfaas_pd":
            self.counted_urls = [st.urls["router"] + "/metrics", st.urls["gateway"] + "/metrics"]
            return [st.urls["router"]]
        if name == REPLICATED:
            return self._start_replicated()
        port = free_port()
        if name == "all_local":
            assert st.router_config is not None
            cfg = st.router_config.model_copy(update={"remotes": [], "links": []})
            path = st.work_dir / "router-all-local.json"
            write_router_config(path, cfg)
            st.spawn(name, [*PRFAAS, "router", "--config", str(path), "--port", str(port)])
        elif name == "vllm_router_pd":
            prefill = [st.urls[f"pd-{i}"] for i in range(st.spec.initial_prefill)]
            prefill += [st.urls[f"prfaas-{i}"] for i in range(st.spec.n_prfaas)]
            decode = [st.urls[f"pd-{i}"] for i in range(st.spec.initial_prefill, st.spec.n_pd)]
            argv = [str(BIN / "vllm-router"), "--vllm-pd-disaggregation", "--kv-connector", "nixl"]
            for url in prefill:
                argv += ["--prefill", url]
            for url in decode:
                argv += ["--decode", url]
            argv += ["--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1"]
            argv += ["--prometheus-port", str(free_port()), "--log-level", "warning"]
            st.spawn(name, argv, env=OFFLINE_ENV)
        else:
            raise ValueError(name)
        url = f"http://127.0.0.1:{port}"
        self._wait_serving(url)
        return [url]

    def _start_replicated(self, routers: int = 3, gateways: int = 2) -> list[str]:
        """Fresh gateway replicas (the stack's gateway config, ``admission.replicas`` = ``gateways``) and router
        replicas (the stack's router config, each on one gateway in turn)."""
        st = self.stack
        if not st.spec.gateway_admission or st.router_config is None:
            raise SystemExit(f"{REPLICATED} needs --gateway-admission: its gateway replicas share the link's cap")
        gw = json.loads((st.work_dir / "gateway.json").read_text())
        ports = [free_port() for _ in range(gateways)]
        gw_urls = [f"http://127.0.0.1:{port}" for port in ports]
        # each starts with cap / N and borrows the others' idle share for a pull that misses some
        gw["gateway"]["admission"].update(replicas=gateways, peers=gw_urls)
        (st.work_dir / "gateway-replica.json").write_text(json.dumps(gw, indent=2))
        for g, port in enumerate(ports):
            argv = [*PRFAAS, "router", "--config", str(st.work_dir / "gateway-replica.json"), "--port", str(port)]
            st.spawn(f"gateway-r{g}", argv)
        router_ports = [free_port() for _ in range(routers)]
        urls = [f"http://127.0.0.1:{port}" for port in router_ports]
        token = st.work_dir / "router-peers-token"
        token.write_text(os.urandom(16).hex())
        # each recognises itself; they authenticate their books as the chart's replicas do
        peers = [] if self.args.no_replica_sync else ["--peers", ",".join(urls), "--peers-token-file", str(token)]
        for r, port in enumerate(router_ports):
            target = gw_urls[r % gateways]
            remote = st.router_config.remotes[0].model_copy(update={"url": target, "status_url": target + "/status"})
            cfg = st.router_config.model_copy(update={"remotes": [remote]})
            path = st.work_dir / f"router-r{r}.json"
            write_router_config(path, cfg)
            st.spawn(f"router-r{r}", [*PRFAAS, "router", "--config", str(path), "--port", str(port), *peers])
        for url in urls:
            self._wait_serving(url)
        self.counted_urls = [u + "/metrics" for u in urls + gw_urls]
        return urls

    def _wait_serving(self, url: str, timeout_s: float | None = None) -> None:
        """Until ``url`` answers a completion; the deadline (90 s) stretches with the machine's load and only
        bounds a hang; progress every 10 s."""
        if timeout_s is None:
            timeout_s = min(600.0, 90.0 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1)))
        body = {"model": "prfaas", "prompt": [1, 2, 3, 4], "max_tokens": 1}
        started = time.monotonic()
        deadline, next_note, last = started + timeout_s, started + 10.0, "no answer yet"
        with httpx.Client(timeout=10.0) as client:
            while time.monotonic() < deadline:
                self.stack.check_alive()
                try:
                    status = client.post(f"{url}/v1/completions", json=body).status_code
                    if status == 200:
                        return
                    last = f"answered {status}"
                except httpx.HTTPError as exc:
                    last = exc.__class__.__name__
                if time.monotonic() >= next_note:
                    print(
                        f"waiting for {url}: {time.monotonic() - started:.0f}/{timeout_s:.0f} s, {last}",
                        file=sys.stderr,
                    )
                    next_note += 10.0
                time.sleep(0.5)
        raise RuntimeError(f"{url} did not serve within {timeout_s:.0f} s (last: {last})")

    def stop_system(self, name: str) -> None:
        if name == REPLICATED:
            for proc in [n for n, _ in self.stack.procs.procs if n.startswith(("router-r", "gateway-r"))]:
                self.stack.terminate(proc)
        elif name != "prfaas_pd":
            self.stack.terminate(name)

    # --- one probe ----------------------------------------------------------------------------------------
    def probe(self, url: list[str], rate: float, run_to_end: bool) -> Probe:
        records = at_rate(self.base, rate, self.args.probe_seconds, self.args.min_requests)
        self.probe_seq += 1
        bodies = prepare_bodies(records, seed=self.args.seed * 1000 + self.probe_seq)  # fresh prompts: no hits
        allowed = math.floor((1 - ATTAINMENT) * len(records))
        slo, scale = self.slo, self.scale

        def hopeless(results: list[Result] | Any) -> bool:
            now = time.perf_counter()
            return sum(1 for r in results if r.missed(slo, now, scale)) > allowed

        async def run() -> tuple[list[Result], list[float]]:
            stop = asyncio.Event()
            egress: list[float] = []
            sampler = asyncio.create_task(sample_egress(self.stack.link_metric_urls, scale, stop, egress))
            try:
                results = await replay(url, records, scale, bodies=bodies, abort_when=None if run_to_end else hopeless)
            finally:
                stop.set()
                await sampler
            return results, egress

        ours = self.counted_urls
        before = scrape(ours, self.stack.gateway_headers)
        cpu0 = self.stack.cpu_seconds()
        t0 = time.perf_counter()
        results, egress = asyncio.run(run())
        wall = time.perf_counter() - t0
        cpu1 = self.stack.cpu_seconds()
        if not self.stack.wait_idle():
            print("warning: engines still busy after 300 s", file=sys.stderr)
        after = scrape(ours, self.stack.gateway_headers)
        with (self.stack.work_dir / "requests.jsonl").open("a") as out:  # each request's figures, to look into
            for r in results:
                row = {"system": self.system, "rate_rps": round(rate, 4), "input_tokens": r.input_tokens}
                row |= {"route": r.route, "status": r.status, "ttft_s": r.ttft_s, "tpot_s": r.tpot_s}
                row |= {"ttft_limit_s": ttft_objective_s(slo, r.input_tokens), "miss": r.miss_reason(slo)}
                row |= {"timing_s": {k: round(v, 4) for k, v in r.timing.items()}}  # Server-Timing, model s
                out.write(json.dumps(row) + "\n")
        counted = {k: v - before.get(k, 0.0) for k, v in after.items()}
        summary = summarize(results, slo)
        by_route = {
            route: round(summarize([r for r in results if r.route == route], slo).attainment, 4)
            for route in sorted({r.route for r in results})
        }
        stopped = any(r.status == 0 for r in results)
        cpu = {k: cpu1[k] - cpu0.get(k, 0.0) for k in cpu1}
        p = Probe(
            rate,
            len(records),
            summary.attainment,
            summary.attainment >= ATTAINMENT,
            stopped,
            {**summary.as_json(), "by_route": by_route},
            sum(egress) / len(egress) if egress else 0.0,
            max(egress) if egress else 0.0,
            wall,
            cpu,
            counted,
        )
        print(
            f"  {rate:6.3f} req/s x{len(records):4d}: SLO {p.attainment:6.1%} {'pass' if p.passed else 'FAIL'}"
            f"{' (stopped early)' if stopped else ''}; TTFT p50/p90 {summary.ttft_p50_s}/{summary.ttft_p90_s} s; "
            f"egress peak {p.egress_peak_gbps:.1f} Gbps; {wall:.0f} s wall",
            file=sys.stderr,
        )
        return p

    # --- the search ---------------------------------------------------------------------------------------
    def search(self, name: str) -> dict[str, Any]:
        """Walk a common grid of rates from the reference rate: up while the SLO holds, down while it does not;
        goodput = the crossing of 90 % interpolated between the last rate that held and the first that did
        not (every system sees the same grid rates, so the same requests)."""
        a = self.args
        grid = self.grid
        print(f"{name}:", file=sys.stderr)
        started = time.perf_counter()
        if self.stack.spec.egress_pacing:  # ours paces the PrFaaS instances' egress; a peer runs unpaced
            self.stack.pace_relays(name in PACED)
        url = self.start_system(name)
        self.system = name
        probes: dict[int, Probe] = {}
        try:
            i = grid.index(a.reference_rps)
            probes[i] = self.probe(url, grid[i], run_to_end=True)
            step = 1 if probes[i].passed else -1
            i += step
            while 0 <= i < len(grid) and len(probes) < a.probes:
                probes[i] = self.probe(url, grid[i], run_to_end=not a.stop_early)
                if probes[i].passed != probes[i - step].passed:
                    break
                i += step
        finally:
            self.stop_system(name)
        passed = [k for k, p in probes.items() if p.passed]
        failed = [k for k, p in probes.items() if not p.passed]
        best = probes[max(passed)] if passed else None
        goodput: float | None = None
        bound = ""
        if best is not None and failed and min(failed) == max(passed) + 1:
            lo, hi = best, probes[min(failed)]
            # (an early-stopped probe's attainment is a lower bound: the estimate is then pessimistic)
            frac = (lo.attainment - ATTAINMENT) / max(lo.attainment - hi.attainment, 1e-9)
            goodput = lo.rate_rps + (hi.rate_rps - lo.rate_rps) * min(1.0, max(0.0, frac))
            bound = "interpolated" + (" (upper probe stopped early)" if hi.stopped_early else "")
        elif best is not None:
            goodput, bound = best.rate_rps, "at least (no higher grid rate failed within the probe budget)"
        elif failed:
            goodput, bound = None, f"below {grid[min(failed)]:.3f} req/s (the lowest grid rate probed failed)"
        ref = probes[grid.index(a.reference_rps)]
        cpu = ref.cpu_s
        groups = {
            "engines": sum(v for k, v in cpu.items() if k.startswith(("pd-", "prfaas-"))),
            "link_relays": sum(v for k, v in cpu.items() if k.startswith("link-")),
            "gateway": cpu.get("gateway", 0.0) if name == "prfaas_pd" else 0.0,
            "router": cpu.get("router" if name == "prfaas_pd" else name, 0.0),
        }
        if name == REPLICATED:
            groups["gateway"] = sum(v for k, v in cpu.items() if k.startswith("gateway-r"))
            groups["router"] = sum(v for k, v in cpu.items() if k.startswith("router-r"))
        ordered = [probes[k] for k in sorted(probes)]
        return {
            "goodput_rps": round(goodput, 4) if goodput is not None else None,
            "goodput_how": bound,
            "highest_rate_meeting_slo_rps": round(best.rate_rps, 4) if best else None,
            "reference": ref.as_json(),
            "at_highest_passing_rate": best.as_json() if best else None,
            "egress_peak_gbps_all_probes": round(max(p.egress_peak_gbps for p in ordered), 3),
            "reference_cpu_seconds": {k: round(v, 1) for k, v in groups.items()},
            "reference_machine_utilisation": round(sum(groups.values()) / (ref.wall_s * (os.cpu_count() or 1)), 3),
            "probes": [p.as_json() for p in ordered],
            "wall_s": round(time.perf_counter() - started, 1),
        }


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--time-scale", type=float, default=3.0, help="model seconds per wall second (default 3)")
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument(
        "--link-gbps", type=float, default=100.0, help="link capacity, model Gbps (default 100; the plan follows it)"
    )
    ap.add_argument("--probes", type=int, default=5, help="probes per system at most, the reference one included")
    ap.add_argument("--probe-seconds", type=float, default=150.0, help="model seconds of arrivals per probe")
    ap.add_argument("--min-requests", type=int, default=80, help="requests per probe at least")
    ap.add_argument("--max-requests", type=int, default=240, help="requests per probe at most")
    ap.add_argument(
        "--grid",
        default="0.2,0.3,0.4,0.5,0.6,0.7,0.8",
        help="the rates probed, as fractions of the planner's Λ_max (default %(default)s)",
    )
    ap.add_argument("--reference", type=float, default=0.5, help="the first probe, a fraction of Λ_max (default 0.5)")
    ap.add_argument(
        "--stop-early",
        action="store_true",
        help="stop a probe (but the reference one) once more than 10 %% of its requests have missed: faster, "
        "but its attainment is then a lower bound and the interpolated goodput pessimistic",
    )
    ap.add_argument(
        "--systems",
        default=None,
        help=f"comma-separated subset of {', '.join(SYSTEMS)} (default: all; {REPLICATED} only with "
        "--gateway-admission)",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--gateway-admission",
        action="store_true",
        help=f"the gateway schedules the link (source-side admission, link windows) for prfaas_pd and {REPLICATED}",
    )
    ap.add_argument(
        "--egress-pacing",
        action="store_true",
        help="with --gateway-admission: each PrFaaS instance's egress paced to cap / instances while our systems run "
        "(linkScheduling.egressPacing: PerInstance), so one pull per instance fits under the cap; the peers run on "
        "the unpaced link",
    )
    ap.add_argument(
        "--max-utilization",
        type=float,
        default=0.8,
        help="the link's maxUtilization, our cap as a fraction of the link (default 0.8, the InterDCLink default); 1.0 "
        "gives our systems the same wire the peers use",
    )
    ap.add_argument(
        "--no-replica-sync",
        action="store_true",
        help=f"{REPLICATED}'s router replicas do not share their PD prefill books (the A/B of --peers)",
    )
    ap.add_argument("--work-dir", default=None, help="logs and configs (default: a temp dir)")
    ap.add_argument("--out", default="out/bench/goodput.json")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help=f"the real code path on a tiny input (our router, {REPLICATED} and all-local, the gateway scheduling the "
        "link, its egress paced, one probe of 6 requests, 8 output tokens): what the test suite runs so that the "
        "benchmark never rots; its figures mean nothing",
    )
    args = ap.parse_args()
    if args.smoke:
        args.systems, args.probes, args.probe_seconds = f"prfaas_pd,{REPLICATED},all_local", 1, 5.0
        args.min_requests, args.max_requests, args.output_tokens = 6, 6, 8
        args.gateway_admission = args.egress_pacing = True
    if args.systems is None:
        args.systems = ",".join(s for s in SYSTEMS if s != REPLICATED or args.gateway_admission)
    systems = [s for s in args.systems.split(",") if s]
    if unknown := set(systems) - set(SYSTEMS):
        ap.error(f"unknown systems: {sorted(unknown)}")
    if args.egress_pacing and not args.gateway_admission:
        ap.error("--egress-pacing needs --gateway-admission (the gateway books each pull at the paced rate)")
    if not 0.0 < args.max_utilization <= 1.0:
        ap.error(f"--max-utilization must be in (0, 1], got {args.max_utilization}")
    if REPLICATED in systems and not args.gateway_admission:
        ap.error(f"{REPLICATED} needs --gateway-admission (its gateway replicas share the link's cap)")
    inputs = replace(
        case_study_inputs(),
        n_prfaas=2,
        n_pd=4,
        output_tokens=float(args.output_tokens),
        link_capacity_gbps=args.link_gbps,
        link_max_utilization=args.max_utilization,
    )
    point = plan(inputs).prfaas_pd.point
    args.lambda_max = point.throughput_rps
    args.grid = [float(x) for x in args.grid.split(",") if x]
    args.reference_rps = round(args.reference * point.throughput_rps, 3)
    spec = StackSpec(
        n_prfaas=2,
        n_pd=4,
        initial_prefill=point.n_prefill,
        link_gbps=args.link_gbps,
        time_scale=args.time_scale,
        threshold_min_tokens=round(point.split.threshold_tokens),
        gateway_admission=args.gateway_admission,
        egress_pacing=args.egress_pacing,
        link_max_utilization=args.max_utilization,
        router_extra={"security": {"serverTiming": True}},  # its rows record where each request's time went
    )
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="prfaas-goodput-"))
    stack = LocalStack(spec, work)
    slo = SloSpec()
    started = time.perf_counter()
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    try:
        stack.start()
        bench = Bench(args, stack, slo)
        for name in systems:
            results[name] = bench.search(name)
    finally:
        stack.stop()
    ours = results.get("prfaas_pd", {}).get("goodput_rps")
    cap = spec.link_gbps * spec.link_max_utilization
    burst = stack.relay_burst_gbit()
    out = {
        "benchmark": "goodput_vs_peers",
        "setup": {
            "prfaas_engines": f"{spec.n_prfaas} x H200 (emulated), KV over {spec.n_prfaas} link relays",
            "pd_engines": f"{spec.n_pd} x H20 (emulated): {point.n_prefill} prefill / {point.n_decode} decode",
            "link_gbps": spec.link_gbps,
            "gateway_admission": spec.gateway_admission,
            "egress_pacing_gbps_per_instance": stack.relay_gbps(True) if spec.egress_pacing else None,
            "link_cap_gbps": cap,
            "router_replica_sync": not args.no_replica_sync,
            "rtt_ms": spec.rtt_ms,
            "threshold_min_tokens": spec.threshold_min_tokens,
            "planner_lambda_max_rps": round(point.throughput_rps, 3),
            "time_scale": spec.time_scale,
            "output_tokens": args.output_tokens,
            "lengths": "log-normal mu 9.90 sigma 1.00 on [128, 131072], Poisson arrivals, no prefix sharing",
            "slo": {
                "ttft_s": "2 + 0.2 per 1K prompt tokens (the whole prompt)",
                "min_decode_tokens_per_s": 40,
                "attainment": 0.9,
            },
            "reference_rps": args.reference_rps,
            "grid_rps": [round(f * point.throughput_rps, 3) for f in args.grid],
            "probes_per_system_at_most": args.probes,
            "probe_model_seconds": args.probe_seconds,
            "vllm_router": "0.1.17, --vllm-pd-disaggregation --kv-connector nixl, default policy (cache_aware)",
            "cpus": os.cpu_count(),
            "load_average_before": [round(x, 2) for x in load_before],
        },
        "systems": results,
        "ratios": {
            "goodput_ours_over_vllm_router": ratio(ours, results.get("vllm_router_pd", {}).get("goodput_rps")),
            "goodput_ours_over_all_local": ratio(ours, results.get("all_local", {}).get("goodput_rps")),
            "goodput_3_routers_over_1": ratio(results.get(REPLICATED, {}).get("goodput_rps"), ours),
        },
        "egress_peak_within_cap": {name: r["egress_peak_gbps_all_probes"] <= cap for name, r in results.items()},
        "egress_peak_within_cap_and_shaper_burst": {
            name: r["egress_peak_gbps_all_probes"] <= cap + burst for name, r in results.items()
        },
        "targets": {"goodput_ratio_vs_vllm_router": 1.3, "egress_peak_gbps_at_most": cap},
        "shaper_burst_gbit": round(burst, 3),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    text = json.dumps(out, indent=2)
    print(text)
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
