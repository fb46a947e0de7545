"""Two regions in two network namespaces, joined by a veth pair that the kernel shapes with ``tbf``: vLLM's own KV
pulls (NIXL over UCX TCP) cross it, and every byte is held against the kernel's counters.

Region A: the PrFaaS engine and the gateway. Region B: one PD engine (``pd-both``: it decodes remote KV and
prefills locally when the remote side cannot) and the router. The engines' field references (``VLLM_HOST_IP``,
the NIXL side channel) resolve to the namespace's address and ``UCX_NET_DEVICES`` names its veth end; the test
reaches the router and the engines through forwarders (no address outside the two namespaces).

This module runs first in the tier (conftest orders it) and ends its two engines (~5 GiB) before the tier's
loopback set (~10.5 GiB) starts, so the tier never holds both.

Bounds (measured on this machine kind; see docs/testbed.md's figures):
* the veth's A→B bytes during remote requests ≥ the KV bytes vLLM moved (whole 128-token blocks of 64 KiB) and
  ≤ those × (1 + TCP_OVERHEAD) + PER_REQUEST_BYTES per request + BACKGROUND_BYTES_PER_S × the elapsed time
  (HTTP answers, the gateway's status answers polled by the router, UCX control traffic);
* the router's link accounting (``prfaas_router_remote_kv_bytes_total``: the prompt's whole 128-token blocks ×
  512 B of the tiny model's profile, as vLLM moves them) within ROUTER_TOLERANCE of the kernel's count;
* a KV pull of N bytes takes at least (N − burst) / rate (tbf's token bucket: a lower bound the kernel enforces,
  which no load can break), and tbf's overlimits counter shows it throttled the pull;
* a cut link, with the router's default breaker settings: every request during the cut is answered (fallback or
  local prefill), and the breaker opens — after ``breakerFailureThreshold`` failed remote prefills or, whichever
  comes first, when the gateway's status endpoint has failed 3 polls (the router stops using the remote then, so
  the threshold alone might never be reached); it closes again on the first remote prefill after the link
  returns. Every wait is on a condition, bounded by a generous deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest

from prfaas_core import names
from prfaas_core.launch.vllm import PREFILL_KV_PARAMS
from prfaas_engine.batching import kv_pull_tokens
from prfaas_local.netns import LinkShape, NetnsPair, NetnsUnavailable, Side
from prfaas_local.stack import LocalStack
from prfaas_local.vllm_engines import EnginePool, Prompts, RealEngine, RealEnv
from prfaas_router.state.metrics import sample_sum
from support.real_engines import skip_or_fail
from support.real_routes import on_the_remote_route, route_of, wait_link_whole

SHAPE = LinkShape(rate_mbit=40, burst_bytes=32_768, latency_ms=500)
"""40 Mbit/s (5 MB/s): a 1,500-token prompt's KV (768 KiB) takes ≥ 0.15 s; the bucket holds 32 KiB."""
LONG = 1500
THRESHOLD = 768
KV_BLOCK_BYTES = 128 * 512
"""One CPU vLLM block of the tiny model: 128 tokens × 2 layers × (K, V) × 2 heads × 32 × 2 bytes."""
TCP_OVERHEAD = 0.06
"""TCP/IP headers per 1,448-byte segment (~3.6 %) and UCX's framing, with room."""
PER_REQUEST_BYTES = 16_384
"""The gateway's answer (the KV handle) and UCX's per-transfer control messages, per request."""
BACKGROUND_BYTES_PER_S = 4_096
"""The gateway's /status answers to the router's polls (one per refresh interval) and TCP keep-alives."""
ROUTER_TOLERANCE = 0.12
"""The router counts the whole blocks vLLM moves; the veth adds TCP/IP headers, UCX framing and status polls."""


@dataclass
class Regions:
    pair: NetnsPair
    prfaas: RealEngine
    pd: RealEngine
    stack: LocalStack

    @property
    def router(self) -> str:
        return self.stack.url("router")


def _engine(pool: EnginePool, pair: NetnsPair, side: Side, name: str, role: str) -> RealEngine:
    addr = pair.addr(side)
    spec = pool.spec(role, host=addr, net_device=pair.dev(side))
    access = f"http://127.0.0.1:{pair.expose(side, addr, spec.port)}"
    return pool.start(name, spec, netns=pair.ns(side), host=addr, access=access)


def _via(pair: NetnsPair, side: Side) -> Callable[[int], str]:
    return lambda port: f"http://127.0.0.1:{pair.expose(side, pair.addr(side), port)}"


@pytest.fixture(scope="module")
def regions(vllm_pool: EnginePool, real_env: RealEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Regions]:
    pair = NetnsPair(SHAPE)
    try:
        pair.create()
    except NetnsUnavailable as exc:
        skip_or_fail(f"network namespaces refused: {exc}")
    stack = LocalStack.over_vllm(tmp_path_factory.mktemp("netns-stack"), real_env)
    started: list[str] = []
    try:
        prfaas = _engine(vllm_pool, pair, "a", "ns-prfaas", "prfaas-prefill")
        started.append(prfaas.name)
        pd = _engine(vllm_pool, pair, "b", "ns-pd", "pd-both")
        started.append(pd.name)
        vllm_pool.wait_ready([prfaas, pd])
        vllm_pool.warm_up(prfaas, pd)
        stack.start_router(
            "gateway", stack.make_gateway_config(prfaas), pair.exec_prefix("a"), pair.addr_a, _via(pair, "a")
        )
        stack.wait_ready("gateway")
        config = stack.make_router_config([], [pd], "gateway", THRESHOLD)
        config["links"] = [{"name": "a-to-b", "capacityGbps": SHAPE.rate_mbit / 1000}]
        config["routing"].update(refreshIntervalSeconds=1.0, breakerOpenSeconds=3)  # the default failure threshold
        stack.start_router("router", config, pair.exec_prefix("b"), pair.addr_b, _via(pair, "b"))
        stack.wait_ready("router")
        yield Regions(pair, prfaas, pd, stack)
    finally:
        stack.close()
        for name in started:
            vllm_pool.stop(name)
        pair.close()


def ask(url: str, env: RealEnv, prompt: str, max_tokens: int = 4) -> httpx.Response:
    body = {"model": env.served_model_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(url + "/v1/completions", json=body, timeout=120)


def router_metric(regions: Regions, name: str, labels: dict[str, str]) -> float:
    text = httpx.get(regions.router + "/metrics", timeout=10).text
    return sample_sum(text, name, labels) or 0.0


def pulled_tokens(engine: RealEngine) -> float:
    return engine.prompt_tokens_by_source()["external_kv_transfer"]


def test_kv_pulls_cross_the_shaped_veth_and_the_counters_agree(
    regions: Regions, real_env: RealEnv, prompts: Prompts
) -> None:
    pair = regions.pair
    requests = 4
    before_link, before_router = pair.counters("a"), router_metric(regions, names.METRIC_ROUTER_REMOTE_BYTES, {})
    started = time.monotonic()
    kv_bytes = 0
    for _ in range(requests):

        def send() -> tuple[httpx.Response, float]:
            pulled = pulled_tokens(regions.pd)
            return ask(regions.router, real_env, prompts.text(LONG)), pulled

        # pulls across the shaped veth run late now and then (the estimator then squeezes the link for a while)
        _, pulled = on_the_remote_route(regions.router, send, lambda a: route_of(a[0]))
        tokens = pulled_tokens(regions.pd) - pulled
        assert tokens >= LONG - 10, f"the decode side pulled only {tokens} tokens"
        kv_bytes += -(-int(tokens) // 128) * KV_BLOCK_BYTES
    elapsed = time.monotonic() - started
    link = (pair.counters("a") - before_link).tx_bytes
    router = router_metric(regions, names.METRIC_ROUTER_REMOTE_BYTES, {}) - before_router
    bound = kv_bytes * (1 + TCP_OVERHEAD) + PER_REQUEST_BYTES * requests + BACKGROUND_BYTES_PER_S * elapsed
    print(f"\nveth A→B {link} B; KV moved {kv_bytes} B; router accounted {router:.0f} B; {elapsed:.1f} s")
    print(f"kernel/KV {link / kv_bytes:.4f}; kernel/router {link / router:.4f}; bound {bound:.0f} B")
    assert kv_bytes <= link <= bound
    assert router == kv_bytes  # block-exact: the router counts the whole blocks vLLM moved (fresh prompts)
    assert abs(link - router) <= ROUTER_TOLERANCE * link, (link, router)


def test_a_kv_pull_respects_the_shaped_rate(regions: Regions, real_env: RealEnv, prompts: Prompts) -> None:
    pair, prompt = regions.pair, prompts.text(LONG)
    body = {"model": real_env.served_model_name, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    leg = {**body, "kv_transfer_params": dict(PREFILL_KV_PARAMS), "stream": False}
    r = httpx.post(regions.prfaas.reach_url + "/v1/completions", json=leg, timeout=120)
    assert r.status_code == 200, r.text
    handle = r.json()["kv_transfer_params"]
    assert handle["remote_host"] == pair.addr_a, handle
    throttled = pair.qdisc("a")["overlimits"]
    before, pulled = pair.counters("a"), pulled_tokens(regions.pd)
    started = time.monotonic()
    r = httpx.post(regions.pd.reach_url + "/v1/completions", json={**body, "kv_transfer_params": handle}, timeout=120)
    took = time.monotonic() - started
    assert r.status_code == 200, r.text
    moved = (pair.counters("a") - before).tx_bytes
    kv_bytes = -(-int(pulled_tokens(regions.pd) - pulled) // 128) * KV_BLOCK_BYTES
    print(f"\npull of {kv_bytes} B KV ({moved} B on the veth) took {took:.3f} s; ≥ {SHAPE.min_seconds(kv_bytes):.3f}")
    assert moved >= kv_bytes > 0
    assert took >= SHAPE.min_seconds(kv_bytes)
    assert pair.qdisc("a")["overlimits"] > throttled, "tbf never held a packet back: the pull did not cross it"


def test_a_cut_link_falls_back_locally_then_the_breaker_closes_again(
    regions: Regions, real_env: RealEnv, prompts: Prompts
) -> None:
    pair, router = regions.pair, regions.router
    breaker = {"remote": "prfaas"}
    served: list[tuple[str, str, str]] = []  # (route, text, "")
    texts: list[str] = []

    def send() -> str:
        prompt = prompts.text(LONG)
        r = ask(router, real_env, prompt)
        assert r.status_code == 200, r.text
        served.append((r.headers["x-prfaas-route"], r.json()["choices"][0]["text"], prompt[:0]))
        texts.append(prompt)
        return served[-1][0]

    # the previous tests' pulls across the shaped veth may have left the link's estimate squeezed
    wait_link_whole(router)
    assert send() == "remote"
    pair.cut()
    try:
        deadline = time.monotonic() + 60
        while router_metric(regions, names.METRIC_ROUTER_BREAKER_OPEN, breaker) != 1:
            assert send() in ("fallback", "local")
            log = regions.stack.procs.log("router")[-3000:]
            assert time.monotonic() < deadline, f"the breaker never opened while the link was cut: {served}\n{log}"
    finally:
        pair.restore()
    deadline = time.monotonic() + 90
    while send() != "remote":
        assert time.monotonic() < deadline, f"the router never used the link again: {[s[0] for s in served]}"
        time.sleep(0.3)
    # the gauge follows the breaker at the router's next refresh (every refreshIntervalSeconds)
    deadline = time.monotonic() + 30
    while router_metric(regions, names.METRIC_ROUTER_BREAKER_OPEN, breaker) != 0:
        assert time.monotonic() < deadline, "the breaker stayed open after a remote request succeeded"
        time.sleep(0.2)
    # nothing lost, and each answer is the one the PD engine gives by itself (greedy)
    for (route, text, _), prompt in zip(served, texts, strict=True):
        alone = ask(regions.pd.reach_url, real_env, prompt)
        assert alone.status_code == 200, alone.text
        assert text == alone.json()["choices"][0]["text"], route
    print("\nroutes:", [route for route, _, _ in served])


WIRE_CONTROL_BYTES = 8_192
"""UCX's and NIXL's own messages per pull, beyond the KV blocks (measured ~1-2 KiB)."""
HEADER_BYTES = 66
"""Ethernet 14 + IPv4 20 + TCP 20 + timestamps 12: one set per packet the veth counts (GSO packets included)."""


def test_kv_bytes_per_request_on_the_wire_match_the_emulator(regions: Regions, real_env: RealEnv) -> None:
    """vLLM moves whole 128-token blocks (a 129-token prompt: two blocks, 128 KiB); the emulator moves the same
    (``prfaas_engine.batching.kv_pull_tokens``) — before this check it moved tokens × bytes per token."""
    pair = regions.pair
    for n in (129, 300):
        ids = [10 + (i * 7919 + n * 104_729) % 2000 for i in range(n)]  # fresh per length: nothing cached
        body = {"model": real_env.served_model_name, "prompt": ids, "max_tokens": 1, "temperature": 0}
        leg = {**body, "kv_transfer_params": dict(PREFILL_KV_PARAMS), "stream": False}
        r = httpx.post(regions.prfaas.reach_url + "/v1/completions", json=leg, timeout=120)
        assert r.status_code == 200, r.text
        before, pulled = pair.counters("a"), pulled_tokens(regions.pd)
        started = time.monotonic()
        r = httpx.post(
            regions.pd.reach_url + "/v1/completions",
            json={**body, "kv_transfer_params": r.json()["kv_transfer_params"]},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        moved = pair.counters("a") - before
        background = BACKGROUND_BYTES_PER_S * (time.monotonic() - started)  # the router's status polls go on
        payload = moved.tx_bytes - HEADER_BYTES * moved.tx_packets
        assert pulled_tokens(regions.pd) - pulled == n
        emulator = kv_pull_tokens(n, 128) * 512
        print(
            f"\n{n} tokens: veth {moved.tx_bytes} B in {moved.tx_packets} packets, payload ~{payload} B; "
            f"emulator {emulator} B"
        )
        assert emulator <= payload <= emulator + WIRE_CONTROL_BYTES + background, (payload, emulator, background)
