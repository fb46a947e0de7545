"""``prfaas up --engines vllm``: the local two-datacenter stack on real vLLM engines (CPU build, the tiny model
``scripts/real-engines.sh`` generates, or with ``--model hybrid`` its tiny Qwen3-Next), with the router, the gateway
and the core's long-term loop live.

Region A: one PrFaaS prefill engine behind the gateway. Region B: ``--pd`` PD engines (``pd-both``: kv_both, so
either role label works without a restart) behind the router; the first is labelled prefill, the others decode.
With ``--netns`` each region runs in a network namespace of its own and the KV crosses a veth shaped by the
kernel's ``tbf`` (:mod:`prfaas_local.netns`); the summary then holds the veth's byte counter against the router's
link accounting.

Real vLLM has no admin role or drain API: a flip is a relabel the router honours (its RouterConfig file's
``endpoints[].role``) after a drain — the router stops sending the instance new work (``draining``) and the
loop waits until vLLM's own gauges (requests running + waiting, :data:`prfaas_core.launch.vllm.METRICS`) show
nothing in flight.

Traffic: Poisson arrivals of fresh prompts (the tiny model's tokens, log-normal lengths on [128, 1900], under its
2,048-token context), replayed in real time; the loop's planner inputs carry the same length distribution.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from prfaas_core import names
from prfaas_core.api import RouterConfig, SloSpec
from prfaas_core.capacity.plan_inputs import PlanInputs, case_study_inputs
from prfaas_core.capacity.planner import plan
from prfaas_core.capacity.workload import TruncatedLogNormal
from prfaas_core.policy.role_types import RolePolicyParams
from prfaas_core.request.trace import TraceRecord
from prfaas_router.state.metrics import sample_sum

from .load import Result, replay, summarize
from .local_loop import LocalCluster, LocalLoop, decision_json
from .netns import LinkShape, NetnsPair, Side
from .procs import exit_on_sigterm
from .stack import LINK, LocalStack
from .up_serve import print_endpoints
from .vllm_engines import EnginePool, Prompts, RealEngine, RealEnv

LENGTHS = TruncatedLogNormal(6.6, 0.5, 128, 1900)
"""Prompt lengths (tokens): median ~735, within the tiny model's 2,048-token context."""
REAL_ROLE_PARAMS = RolePolicyParams(
    period_s=10.0,
    hysteresis_cycles=2,
    cooldown_s=30.0,
    drain_timeout_s=30.0,
    drain_poll_s=1.0,
    prefill_min=0,
    decode_min=1,
)
"""The long-term loop on real engines: short periods (a run lasts a minute or two). No PD prefill instance is
allowed: a ``pd-both`` decode instance prefills what it is given itself."""


class RealCluster(LocalCluster):
    """The long-term loop's observation and effects over real vLLM: in-flight work from vLLM's own gauges; a
    drain is the router's ``draining`` list, a flip the role label in the router's configuration."""

    reach: dict[str, str]

    def __init__(self, *args: Any, reach: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reach = reach

    def _state(self, url: str) -> dict[str, Any]:
        text = self.http.get(f"{self.reach.get(url, url)}/metrics").text
        running = sample_sum(text, names.VLLM_REQUESTS_RUNNING)
        waiting = sample_sum(text, names.VLLM_REQUESTS_WAITING)
        if running is None or waiting is None:
            raise httpx.HTTPError(f"{url}/metrics has no {names.VLLM_REQUESTS_RUNNING}/{names.VLLM_REQUESTS_WAITING}")
        return {"running": running, "waiting": waiting}

    def label(self, role: str) -> Any:
        """A decode instance is labelled ``both`` for the router: a kv_both engine decodes remote or local KV and,
        while no PD prefill instance is available (the last one draining), prefills in place."""
        return "both" if role == "decode" else role

    def set_drain(self, url: str, drain: bool) -> None:
        """Nothing to tell the engine: the router's ``draining`` list (written by :meth:`apply`) is the drain."""

    def set_role(self, url: str, role: str) -> None:
        """Nothing to tell the engine (kv_both serves either role): the new label in the router's config is
        the flip."""


@dataclass
class RealUp:
    """The stack: engines (through the harness pool), gateway and router, optionally in two namespaces."""

    env: RealEnv
    work: Path
    n_pd: int = 2
    netns: LinkShape | None = None
    pool: EnginePool | None = None
    """The harness pool to start engines through (the real-engine tier passes its own); None: a new one."""
    stack: LocalStack = field(init=False)
    pair: NetnsPair | None = None
    prfaas: RealEngine | None = None
    pd: list[RealEngine] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.own_pool = self.pool is None
        self.engines = self.pool if self.pool is not None else EnginePool(self.env, self.work / "logs")
        self.stack = LocalStack.over_vllm(self.work, self.env)

    def _host(self, side: Side) -> str:
        return self.pair.addr(side) if self.pair else "127.0.0.1"

    def _access(self, side: Side, host: str) -> Any:
        pair = self.pair
        if pair is None:
            return None
        return lambda port: f"http://127.0.0.1:{pair.expose(side, host, port)}"

    def _engine(self, side: Side, name: str, role: str) -> RealEngine:
        pair, host = self.pair, self._host(side)
        spec = self.engines.spec(role, host=host, net_device=pair.dev(side) if pair else "lo")
        access = self._access(side, host)
        url = access(spec.port) if access else None
        return self.engines.start(name, spec, pair.ns(side) if pair else None, host, url)

    def start(self, threshold_tokens: int) -> RouterConfig:
        """Engines, warm-up (each producer's NIXL handshake with each consumer), gateway, router; then ready."""
        if self.netns is not None:
            self.pair = NetnsPair(self.netns)
            self.pair.create()
        self.prfaas = self._engine("a", "prfaas-0", "prfaas-prefill")
        self.pd = [self._engine("b", f"pd-{i}", "pd-both") for i in range(self.n_pd)]
        self.engines.wait_ready([self.prfaas, *self.pd])
        for producer in (self.prfaas, *self.pd):
            for consumer in self.pd:
                if consumer is not producer:
                    self.engines.warm_up(producer, consumer)
        st, pair = self.stack, self.pair
        prefix_a = pair.exec_prefix("a") if pair else []
        prefix_b = pair.exec_prefix("b") if pair else []
        st.start_router(
            "gateway",
            st.make_gateway_config(self.prfaas),
            prefix_a,
            self._host("a"),
            self._access("a", self._host("a")),
        )
        st.wait_ready("gateway")
        config = st.make_router_config(self.pd[:1], self.pd[1:], "gateway", threshold_tokens)
        for endpoint in config["endpoints"]:  # decode instances prefill in place when no prefill one can
            endpoint["role"] = "both" if endpoint["role"] == "decode" else endpoint["role"]
        if self.netns is not None:
            config["links"] = [{"name": LINK, "capacityGbps": self.netns.rate_mbit / 1000}]
        router = RouterConfig.model_validate(config)
        st.start_router(
            "router",
            router.model_dump(mode="json", by_alias=True, exclude_none=True),
            prefix_b,
            self._host("b"),
            self._access("b", self._host("b")),
        )
        st.wait_ready("router")
        return router

    @property
    def reach(self) -> dict[str, str]:
        """Engine URL as the router sees it → as this process reaches it."""
        return {e.url: e.reach_url for e in (self.prfaas, *self.pd) if e is not None}

    def stop(self) -> None:
        self.stack.close()
        for engine in (self.prfaas, *self.pd):
            if engine is not None:
                self.engines.stop(engine.name)
        if self.own_pool:
            self.engines.close()
        if self.pair is not None:
            self.pair.close()


def trace(rate_rps: float, duration_s: float, output_tokens: int, seed: int) -> list[TraceRecord]:
    rng = random.Random(seed)
    out: list[TraceRecord] = []
    t = rng.expovariate(rate_rps)
    while t <= duration_s:
        n = LENGTHS.sample(rng)
        out.append(
            TraceRecord(
                arrival_s=t,
                input_tokens=n,
                output_tokens=output_tokens,
                session_id=f"s{len(out)}",
                shared_prefix_tokens=0,
            )
        )
        t += rng.expovariate(rate_rps)
    return out


def bodies(records: list[TraceRecord], prompts: Prompts, model: str) -> list[bytes]:
    """Streamed completions of fresh text prompts of each record's length (the tiny model's tokens)."""
    out = []
    for rec in records:
        body = {
            "model": model,
            "prompt": prompts.text(rec.input_tokens),
            "max_tokens": rec.output_tokens,
            "min_tokens": rec.output_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        out.append(json.dumps(body).encode())
    return out


def _metric(url: str, name: str) -> float:
    with contextlib.suppress(httpx.HTTPError):
        return sample_sum(httpx.get(f"{url}/metrics", timeout=5).text, name) or 0.0
    return 0.0


async def drive(
    up: RealUp, cluster: RealCluster, loop: LocalLoop, records: list[TraceRecord] | None, body: list[bytes]
) -> list[Result]:
    """Replay ``records`` at the router (real time) while the long-term loop runs; a line of progress every 5 s.
    ``records`` None (``--serve``): no built-in load, the loop runs on the traffic of your own clients until
    Ctrl-C or SIGTERM."""
    router = up.stack.url("router")
    results: list[Result] = []
    stop = asyncio.Event()
    start = time.perf_counter()
    served = f"serving {router}/v1" if records is None else ""

    async def driver() -> None:
        while not stop.is_set():
            now = time.perf_counter() - start
            if now >= loop.next_due_s():
                try:
                    await asyncio.to_thread(loop.run_once, now)
                except (httpx.HTTPError, RuntimeError) as exc:
                    print(f"long-term loop: cycle failed, will retry: {exc}", file=sys.stderr)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)

    async def viewer() -> None:
        while not stop.is_set():
            routes: dict[str, int] = {}
            for r in results:
                routes[r.route] = routes.get(r.route, 0) + 1
            p, d = cluster.counts()
            last = cluster.decisions[-1].reason[:60] if cluster.decisions else "-"
            print(
                f"[{time.perf_counter() - start:5.0f}s] roles P/D {p}/{d} draining {list(cluster.config.draining)} | "
                f"t {cluster.config.threshold_min_tokens} | "
                + (served or f"done {len(results)}/{len(records or [])} {routes}")
                + f" | {last}",
                file=sys.stderr,
                flush=True,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 5.0)

    tasks = [asyncio.create_task(driver()), asyncio.create_task(viewer())]
    try:
        if records is None:
            await _until_stopped()
        else:
            await replay(router, records, 1.0, model=up.env.served_model_name, on_result=results.append, bodies=body)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    return results


async def _until_stopped() -> None:
    """Wait for Ctrl-C or SIGTERM (then the caller stops the stack and writes its summary)."""
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopped.set)
    try:
        await stopped.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def endpoints(up: RealUp) -> dict[str, Any]:
    """What ``prfaas up --engines vllm --serve`` asks a user to point a client or a scraper at."""
    router, gateway = up.stack.url("router"), up.stack.url("gateway")
    return {
        "model": up.env.served_model_name,
        "openai_base_url": f"{router}/v1",
        "router_url": router,
        "router_metrics": f"{router}/metrics",
        "gateway_metrics": f"{gateway}/metrics",
        "gateway_token_file": str(up.stack.token_file),
        "engines": {e.name: e.reach_url for e in up.engines.engines.values()},
        "time_note": "real engines: every figure is wall time",
    }


OUTPUT_TOKENS = 128
"""Output tokens per request unless ``--output-tokens`` says otherwise (the scenario's default is emulated-only)."""


def planned(args: argparse.Namespace, n_pd: int, duration: float) -> tuple[int, list[TraceRecord], PlanInputs]:
    """The planner's ``t`` over the real stack's lengths, the trace to replay and the loop's inputs (no engine
    needed)."""
    output_tokens = args.output_tokens if args.output_tokens is not None else OUTPUT_TOKENS
    inputs = replace(case_study_inputs(), lengths=LENGTHS, n_prfaas=1, n_pd=n_pd, output_tokens=float(output_tokens))
    best = plan(inputs).prfaas_pd.point
    rate = args.load * 2.0  # requests per wall second: 2 req/s saturates 2 cores with three engines
    return round(best.split.threshold_tokens), trace(rate, duration, output_tokens, args.seed), inputs


def run(args: argparse.Namespace, pool: EnginePool | None = None) -> int:
    """``prfaas up --engines vllm`` (``pool``: start the engines through this harness pool, as the tier does)."""
    n_prfaas = args.prfaas if args.prfaas is not None else 1
    n_pd = args.pd if args.pd is not None else 2
    duration = args.duration if args.duration is not None else 60.0
    if args.load is None:
        args.load = 0.5
    if n_prfaas != 1 or n_pd < 1 or duration <= 0 or args.load <= 0:
        print("error: --engines vllm runs --prfaas 1 and --pd >= 1 (positive --duration, --load)", file=sys.stderr)
        return 2
    t0, records, inputs = planned(args, n_pd, duration)
    from .vllm_engines import RealEnginesUnavailable

    try:  # --model hybrid: the tiny hybrid's environment (a tier's pool brings its own)
        env = pool.env if pool is not None else RealEnv.prepare()
        env = env.hybrid() if pool is None and getattr(args, "model", "tiny") == "hybrid" else env
    except RealEnginesUnavailable as exc:
        print(f"error: real engines unavailable: {exc}", file=sys.stderr)
        return 1
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="prfaas-up-vllm-"))
    work.mkdir(parents=True, exist_ok=True)
    shape = LinkShape(rate_mbit=args.netns_mbit) if args.netns else None
    params = replace(REAL_ROLE_PARAMS, override_prefill=args.pin_prefill)
    up = RealUp(env, work, n_pd, shape, pool)
    where = f" in two namespaces over a {shape.rate_mbit:g} Mbit/s tbf veth" if shape else ""
    doing = "serving your requests" if args.serve else f"replaying {len(records)} requests over {duration:g} s"
    print(
        f"real engines: 1 PrFaaS + {n_pd} PD ({env.served_model_name}, CPU vLLM){where}; t = {t0}; {doing}; "
        f"logs in {work / 'logs'}",
        file=sys.stderr,
    )
    started = time.perf_counter()
    if pool is None:
        exit_on_sigterm()
    try:
        router_config = up.start(t0)
        ready_s = time.perf_counter() - started
        cluster = RealCluster(
            work / "router.json",
            router_config,
            up.stack.url("gateway") + "/status",
            gateway_headers={"Authorization": f"Bearer {up.stack.token_file.read_text().strip()}"},
            router_url=up.stack.url("router"),
            reach=up.reach,
        )
        loop = LocalLoop(cluster, params, inputs)
        counters0 = up.pair.counters("a") if up.pair else None
        remote0 = _metric(up.stack.url("router"), names.METRIC_ROUTER_REMOTE_BYTES)
        if args.serve:
            info = endpoints(up)
            (work / "endpoints.json").write_text(json.dumps(info, indent=2))
            print_endpoints(info, work)
            results = asyncio.run(drive(up, cluster, loop, None, []))
        else:
            prompts = Prompts(env.tokenizer_file, args.seed)
            results = asyncio.run(drive(up, cluster, loop, records, bodies(records, prompts, env.served_model_name)))
        out = summary(up, cluster, results, ready_s, time.perf_counter() - started, remote0, counters0)
        cluster.close()
    except (RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        up.stop()
    (work / "summary.json").write_text(json.dumps(out, indent=2))
    if args.output == "json":
        print(json.dumps(out, indent=2))
    else:
        print_summary(out, work)
    if args.serve:
        return 0
    return 0 if out["requests"]["ok"] == out["requests"]["requests"] else 1


def summary(
    up: RealUp, cluster: RealCluster, results: list[Result], ready_s: float, wall_s: float, remote0: float, c0: Any
) -> dict[str, Any]:
    slo = SloSpec()
    by_route = {
        route: summarize([r for r in results if r.route == route], slo).as_json()
        for route in sorted({r.route for r in results})
    }
    remote = _metric(up.stack.url("router"), names.METRIC_ROUTER_REMOTE_BYTES) - remote0
    link: dict[str, Any] = {"router_remote_kv_bytes": remote}
    if up.pair is not None and c0 is not None:
        veth = (up.pair.counters("a") - c0).tx_bytes
        link.update(veth_a_to_b_bytes=veth, kernel_over_router=round(veth / remote, 4) if remote else None)
    actions: dict[str, int] = {}
    for d in cluster.decisions:
        actions[d.action] = actions.get(d.action, 0) + 1
    return {
        "engines": "vllm",
        "requests": summarize(results, slo).as_json(),
        # every request the router answered, the built-in load's and your own clients' (--serve)
        "router_requests_total": _metric(up.stack.url("router"), names.METRIC_ROUTER_REQUESTS),
        "by_route": by_route,
        "link": link,
        "final_roles": dict(zip(("prefill", "decode"), cluster.counts(), strict=True)),
        "threshold_tokens": cluster.config.threshold_min_tokens,
        "loop": {"cycles": len(cluster.decisions), "actions": actions},
        "role_flips": [decision_json(d) for d in cluster.decisions if d.flip],
        "ready_seconds": round(ready_s, 1),
        "wall_seconds": round(wall_s, 1),
        "errors": sorted({f"{r.status}: {r.error}" for r in results if r.status != 200})[:5],
    }


def print_summary(out: dict[str, Any], work: Path) -> None:
    r = out["requests"]
    print(
        f"requests {r['requests']}, ok {r['ok']}; TTFT p50/p90 {r['ttft_p50_s']}/{r['ttft_p90_s']} s (wall); "
        f"the router answered {out['router_requests_total']:g} in all"
    )
    for route, s in out["by_route"].items():
        print(f"  {route:9s} {s['requests']:4d} requests, TTFT p50/p90 {s['ttft_p50_s']}/{s['ttft_p90_s']} s")
    print(f"link: {out['link']}")
    lp = out["loop"]
    print(
        f"long-term loop: {lp['cycles']} cycles {lp['actions']}; flips {len(out['role_flips'])}; roles now "
        f"{out['final_roles']}; t {out['threshold_tokens']}"
    )
    print(
        f"engines ready in {out['ready_seconds']} s; whole run {out['wall_seconds']} s; "
        f"summary: {work / 'summary.json'}"
    )
