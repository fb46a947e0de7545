"""What the router costs as a plain proxy: our router vs vllm-router in front of the same trivial backend, and
both vs a direct connection to it.

* backend: a minimal aiohttp server answering ``POST /v1/completions`` with a fixed one-token completion (and
  ``/health``, ``/metrics`` with the two vLLM queue gauges, which both routers poll);
* ours: ``prfaas router --workers N`` (``--workers``, default the machine's cores, as vllm-router's threads use
  them all; with more than one, a one-worker router runs beside it) with a RouterConfig of one ``both`` endpoint and
  no remote — the plain-proxy path (no disaggregation: ``prfaas_router.path.call.plan_local`` returns no prefill
  instance, one leg goes to the backend);
* vllm-router 0.1.17: ``--worker-urls BACKEND`` (regular mode), with its default policy (``cache_aware``,
  which matches every prompt against a prefix tree) and with ``--policy round_robin`` (the bare proxy);
* direct: the client talks to the backend itself.

Measured with wrk (Debian package, a C load generator, 2 threads): the maximum request rate (closed loop,
``--connections`` connections), and the latency at a fixed rate (wrk's Lua ``delay()`` hook paces each
connection: 25 connections, one request per 50 ms each = 500 req/s, the pause calibrated per target from a
short run; the achieved rate is reported) — p50/p99, and the added
latency = through the router minus direct at the same percentile.

Long bodies (``--long-tokens``, default 32K and 100K tokens by the router's character estimate, 4 characters a
token): the same fixed-rate measurement at ``--long-rate`` (10 req/s) with every request a different prompt of that
length (a per-request prefix, so neither router's prefix cache sees a repeat); the one-token answer makes the
latency the time to first token, and the added TTFT = through the router minus direct. A figure, not a target:
each router parses, and ours tokenises and hashes, every prompt on the machine's 2 cores.

The routing decision's own time comes from ``benchmarks/router_decision.py`` (in-process, the policy call alone;
tokenisation and prefix hashing apart). Every process shares this machine's cores with wrk, so the absolute figures
are the machine's; the ratios are the point.

    .venv/bin/python benchmarks/router_overhead.py [--runs 3] [--workers N] [--seconds 5]
        [--connections 32] [--rate 500] [--long-tokens 32000,100000] [--long-rate 10] [--long-seconds 10] [--smoke]

Prints JSON and writes it to out/bench/overhead.json. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

from prfaas_core.capacity.profiles import builtin_model_profiles
from prfaas_local.ports import free_port
from prfaas_local.procs import spawn_process, stop_processes

PRFAAS = [sys.executable, "-m", "prfaas_cli.main"]
BIN = Path(sys.executable).parent
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_PROXY": "*", "no_proxy": "*"}
BACKEND = textwrap.dedent(
    """
    import json, sys
    from aiohttp import web
    BODY = json.dumps({"id": "cmpl-x", "object": "text_completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "text": " the", "finish_reason": "length", "logprobs": None}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
    METRICS = (b"# TYPE vllm:num_requests_running gauge\\nvllm:num_requests_running{model_name=\\"m\\"} 0.0\\n"
               b"# TYPE vllm:num_requests_waiting gauge\\nvllm:num_requests_waiting{model_name=\\"m\\"} 0.0\\n")
    COUNT = {"completions": 0, "prefill_legs": 0}
    async def complete(request):
        raw = await request.read()
        COUNT["completions"] += 1
        if b"do_remote_decode" in raw:
            COUNT["prefill_legs"] += 1
        return web.Response(body=BODY, content_type="application/json")
    async def count(request):
        return web.json_response(COUNT)
    async def health(request):
        return web.Response(text="ok")
    async def metrics(request):
        return web.Response(body=METRICS, content_type="text/plain")
    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})
    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/count", count)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
    """
)
LONG_CONNECTIONS = 2
"""Connections of the long-body runs (wrk -t2 needs one per thread): at 10 req/s each makes one request per 200 ms."""
POST_LUA = """wrk.method = "POST"
wrk.body = '{"model": "m", "prompt": "hi", "max_tokens": 1}'
wrk.headers["Content-Type"] = "application/json"
"""
PACED_LUA = POST_LUA + "function delay() return {delay_ms} end\n"
LONG_LUA = """
local chars = {tokens} * 4
local words = string.rep("lorem ipsum dolor sit amet ", math.ceil(chars / 27))
local n = 0
local count = 0
function setup(thread) count = count + 1; thread:set("tid", count) end
function request()
  n = n + 1
  local head = "t" .. (tid or 0) .. "r" .. n .. " "
  local prompt = head .. string.sub(words, 1, chars - #head)
  local body = '{"model": "m", "max_tokens": 1, "prompt": "' .. prompt .. '"}'
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
end
function delay() return {delay_ms} end
"""


def wait_post(url: str, deadline_s: float = 60.0) -> None:
    body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 1}).encode()
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        req = urllib.request.Request(
            f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not serve within {deadline_s:.0f} s")


def _ms(value: str, unit: str) -> float:
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def wrk(url: str, seconds: float, connections: int, script: str) -> dict[str, float]:
    """One wrk run: requests/s and latency percentiles (ms); errors (non-2xx, socket) counted."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
    try:
        argv = ["wrk", "-t2", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "10s", "--latency"]
        argv += ["-s", f.name]
        out = subprocess.run([*argv, f"{url}/v1/completions"], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    pct = {q: _ms(*m.groups()) for q, m in ((q, re.search(rf"\s{q}%\s+([\d.]+)(us|ms|s)", out)) for q in (50, 99)) if m}
    total = re.search(r"(\d+) requests in", out)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    errors = (int(non2xx.group(1)) if non2xx else 0) + (sum(int(x) for x in sock.groups()) if sock else 0)
    requests = int(total.group(1)) if total else 0
    return {"rps": round(rps, 1), "p50_ms": pct[50], "p99_ms": pct[99], "errors": errors, "requests": requests}


def paced(url: str, seconds: float, short: float, connections: int, rate: float, script: str) -> dict[str, float]:
    """A fixed-rate wrk run: each connection waits delay_ms after each answer, so a cycle is delay + latency; a
    short calibration run measures the latency and the delay is set so that the cycle hits the target rate.
    ``script``: a Lua script with a ``{delay_ms}`` placeholder."""
    cycle_ms = connections * 1000.0 / rate
    delay_ms = max(1, round(cycle_ms))
    probe = wrk(url, short, connections, script.replace("{delay_ms}", str(delay_ms)))
    latency_ms = max(0.0, connections * 1000.0 / max(probe["rps"], 1.0) - delay_ms)
    delay_ms = max(1, round(cycle_ms - latency_ms))
    fixed = wrk(url, seconds, connections, script.replace("{delay_ms}", str(delay_ms)))
    fixed["delay_ms"] = delay_ms
    return fixed


def median_of(runs: list[dict[str, float]]) -> dict[str, Any]:
    """Each figure's median over the runs, and for more than one run its range (``spread``: [min, max])."""
    out: dict[str, Any] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    if len(runs) > 1:
        out["spread"] = {k: [min(r[k] for r in runs), max(r[k] for r in runs)] for k in ("rps", "p50_ms", "p99_ms")}
    return out


def added_ms(through: list[dict[str, float]], direct: list[dict[str, float]]) -> dict[str, float]:
    """Latency through a router minus direct, p50 and p99: in the same round, then the median over the rounds."""
    pairs = list(zip(through, direct, strict=True))
    return {q: round(statistics.median(r[q] - d[q] for r, d in pairs), 3) for q in ("p50_ms", "p99_ms")}


def backend_count(url: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{url}/count", timeout=5) as resp:
        return dict(json.loads(resp.read()))


def our_config(backend: str, path: Path) -> None:
    model = builtin_model_profiles()["internal-1t"].model_dump(mode="json", by_alias=True, exclude_none=True)
    config = {
        "pdCluster": "bench",
        "thresholdMinTokens": 19_634,
        "model": model,
        "endpoints": [{"name": "backend", "url": backend, "role": "both"}],
        "routing": {"refreshIntervalSeconds": 1.0},
    }
    path.write_text(json.dumps(config))


def decision_time(requests: int) -> dict[str, Any]:
    script = Path(__file__).with_name("router_decision.py")
    out = subprocess.run(
        [sys.executable, str(script), "--requests", str(requests)], capture_output=True, text=True, check=True
    ).stdout
    return dict(json.loads(out))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="duration of each wrk run")
    ap.add_argument("--connections", type=int, default=32, help="connections of the max-rate runs")
    ap.add_argument("--rate", type=float, default=500.0, help="the fixed rate of the latency runs, req/s")
    ap.add_argument("--paced-connections", type=int, default=25, help="connections of the fixed-rate runs")
    ap.add_argument(
        "--long-tokens", default="32000,100000", help="prompt lengths (tokens, comma-separated) of the long-body case"
    )
    ap.add_argument("--long-rate", type=float, default=10.0, help="the long-body case's rate, req/s")
    ap.add_argument("--long-seconds", type=float, default=10.0, help="duration of each long-body run")
    ap.add_argument(
        "--runs", type=int, default=1, help="rounds over every target (figures: the medians, with their ranges)"
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="our router's --workers (default: the machine's cores, as vllm-router's threads); more than 1 also "
        "runs a one-worker router beside it",
    )
    ap.add_argument("--out", default="out/bench/overhead.json")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="the real code path on a tiny input (1-s runs, a short warm-up and calibration, 200 decisions): what "
        "the test suite runs so that the benchmark never rots; its figures mean nothing",
    )
    args = ap.parse_args()
    if args.smoke:
        args.seconds = args.long_seconds = 1.0
        args.long_tokens = "1000"
    long_tokens = [int(t) for t in args.long_tokens.split(",") if t.strip()]
    short = 1.0 if args.smoke else 2.0
    if shutil.which("wrk") is None:
        print("error: wrk is not installed (scripts/system-deps.sh installs it)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="prfaas-overhead-"))
    procs: list[subprocess.Popen[bytes]] = []
    runs: dict[str, list[dict[str, dict[str, float]]]] = {}
    long_runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    cycle_ms = args.paced_connections * 1000.0 / args.rate  # per connection: one request per cycle
    started = time.perf_counter()
    try:
        port = free_port()
        procs.append(spawn_process([sys.executable, "-c", BACKEND, str(port)], work / "backend.log"))
        backend = f"http://127.0.0.1:{port}"
        targets = {"direct": backend}
        our_config(backend, work / "router.json")
        for name, workers in (("prfaas_router", args.workers), ("prfaas_router_1_worker", 1)):
            if name != "prfaas_router" and args.workers == 1:
                continue
            ours = free_port()
            argv = [*PRFAAS, "router", "--config", str(work / "router.json"), "--port", str(ours)]
            procs.append(spawn_process([*argv, "--workers", str(workers)], work / f"{name}.log"))
            targets[name] = f"http://127.0.0.1:{ours}"
        for name, policy in (("vllm_router", []), ("vllm_router_round_robin", ["--policy", "round_robin"])):
            vllm = free_port()
            procs.append(
                spawn_process(
                    [
                        str(BIN / "vllm-router"), "--worker-urls", backend, "--host", "127.0.0.1", "--port", str(vllm),
                        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                        "--log-level", "warning", *policy,
                    ],
                    work / f"{name}.log",
                    env=OFFLINE_ENV,
                )
            )  # fmt: skip
            targets[name] = f"http://127.0.0.1:{vllm}"
        for url in targets.values():
            wait_post(url)
        for round_ in range(args.runs):  # the targets in turn, each round: the machine's drift hits them alike
            for name, url in targets.items():
                wrk(url, 1, args.connections, POST_LUA)  # warm-up: connection pools, caches
                before = backend_count(backend)
                max_rate = wrk(url, args.seconds, args.connections, POST_LUA)
                after = backend_count(backend)
                # legs per client request (wrk's count misses the requests in flight when it stops: ~connections)
                max_rate["backend_requests_per_request"] = round(
                    (after["completions"] - before["completions"]) / max(max_rate["requests"], 1), 3
                )
                max_rate["prefill_legs"] = after["prefill_legs"] - before["prefill_legs"]
                fixed = paced(url, args.seconds, short, args.paced_connections, args.rate, PACED_LUA)
                runs.setdefault(name, []).append({"max": max_rate, "fixed_rate": fixed})
                print(
                    f"[{round_ + 1}/{args.runs}] {name}: max {max_rate}, at ~{args.rate:g} req/s {fixed}",
                    file=sys.stderr,
                )
            for tokens in long_tokens:  # long bodies at a low rate: the added time to first token
                script = LONG_LUA.replace("{tokens}", str(tokens))
                for name, url in targets.items():
                    if not args.smoke:
                        wrk(url, 1, LONG_CONNECTIONS, script.replace("{delay_ms}", "100"))  # warm-up
                    fixed = paced(url, args.long_seconds, short, LONG_CONNECTIONS, args.long_rate, script)
                    long_runs.setdefault(str(tokens), {}).setdefault(name, []).append(fixed)
                    print(
                        f"[{round_ + 1}/{args.runs}] {name}: {tokens}-token prompts at ~{args.long_rate:g} req/s "
                        f"{fixed}",
                        file=sys.stderr,
                    )
    finally:
        stop_processes(procs)
    results = {
        name: {part: median_of([r[part] for r in rs]) for part in ("max", "fixed_rate")} for name, rs in runs.items()
    }
    long_results = {t: {name: median_of(rs) for name, rs in by.items()} for t, by in long_runs.items()}
    added = {
        name: added_ms([r["fixed_rate"] for r in runs[name]], [d["fixed_rate"] for d in runs["direct"]])
        for name in runs
        if name != "direct"
    }
    decision = decision_time(200 if args.smoke else 20_000)

    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 3) if b > 0 else None

    out = {
        "benchmark": "router_overhead",
        "setup": {
            "backend": "minimal aiohttp server, fixed one-token completion",
            "load_generator": f"wrk -t2; max rate: {args.connections} connections closed loop; fixed rate: "
            f"{args.paced_connections} connections each pausing between requests (delay() hook) so that each "
            f"makes one request per {cycle_ms:g} ms (pause calibrated per target)",
            "seconds_per_run": args.seconds,
            "runs": args.runs,
            "ours": f"prfaas router --workers {args.workers} (prfaas_router; and one worker, prfaas_router_1_worker, "
            "when that is more than 1), one 'both' endpoint, no remote (plain proxy)",
            "vllm_router": "0.1.17, --worker-urls (regular mode): its default policy (cache_aware: a prefix tree "
            "over the prompt text per request) and --policy round_robin (no routing work: the bare proxy)",
            "cpus": os.cpu_count(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
        },
        "max_rps": {name: r["max"]["rps"] for name, r in results.items()},
        "max_rps_ratio_ours_over_vllm_router": ratio(
            results["prfaas_router"]["max"]["rps"], results["vllm_router"]["max"]["rps"]
        ),
        "max_rps_ratio_ours_over_vllm_router_round_robin": ratio(
            results["prfaas_router"]["max"]["rps"], results["vllm_router_round_robin"]["max"]["rps"]
        ),
        "ours_plain_proxy_path": {
            "backend_requests_per_client_request": results["prfaas_router"]["max"]["backend_requests_per_request"],
            "prefill_legs_sent": results["prfaas_router"]["max"]["prefill_legs"],
        },
        "fixed_rate": {name: r["fixed_rate"] for name, r in results.items()},
        "added_latency_ms": added,
        "added_p99_ratio_ours_over_vllm_router": ratio(
            added["prfaas_router"]["p99_ms"], added["vllm_router"]["p99_ms"]
        ),
        "added_p99_ratio_ours_over_vllm_router_round_robin": ratio(
            added["prfaas_router"]["p99_ms"], added["vllm_router_round_robin"]["p99_ms"]
        ),
        "decision_time_us": {
            "policy_call": decision["policy_call_us"],
            "decision_incl_prefix_lookups_27k_tokens": decision["decision_incl_prefix_lookups_27k_tokens_us"],
            "instance_pick": decision["instance_pick_us"],
            "reported_apart": {
                "tokenize_27k_tokens_ms": decision["tokenize_27k_tokens_ms"],
                "prefix_hash_27k_tokens_ms": decision["prefix_hash_27k_tokens_ms"],
            },
        },
        "long_bodies": {
            "rate_req_s": args.long_rate,
            "seconds_per_run": args.long_seconds,
            "fixed_rate": long_results,
            "added_ttft_ms": {
                tokens: {name: added_ms(rs, by["direct"]) for name, rs in by.items() if name != "direct"}
                for tokens, by in long_runs.items()
            },
        },
        "targets": {"added_p99_ms_at_most": 1.0, "decision_p99_us_at_most": 50},
        "wall_s": round(time.perf_counter() - started, 1),
        "raw": runs,
        "raw_long_bodies": long_runs,
    }
    text = json.dumps(out, indent=2)
    print(text)
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
