"""A hybrid (linear-attention) model on real vLLM with real KV transfer (NixlConnector over UCX TCP) through our
router and gateway: the tiny Qwen3-Next (3 gated-DeltaNet layers + 1 full attention) that ``scripts/real-engines.sh``
generates, its ModelProfile computed by ``prfaas profile`` from its config, its engines' flags derived from that
profile through the engine seam (``hybrid_fields`` -> ``engine_launch``).

Oracles (vLLM's own counters on the decode engine):

* the N-1 rule: the decode side pulls the KV of all prompt tokens but the last and computes that one itself
  (``prompt_tokens_by_source``: ``external_kv_transfer`` N-1, ``local_compute`` 1), on the local and the remote path;
* byte-exact accounting: what the router (``prfaas_router_remote_kv_bytes_total``) and the gateway
  (``prfaas_gateway_kv_egress_bytes_total``) book for a remote request equals ``vllm:nixl_bytes_transferred``, which
  counts the recurrent state too (measured, see docs/hybrid-models.md), also when the decode holds part of the
  prompt already (a repeat: only the blocks it lacks and the state cross);
* the profile's predictions at prompt lengths that did not build it (it is built from the config alone);
* the router's exact prefix index (issue 49): the PD prefill engine publishes its KV events (``--kv-events-config``,
  rendered by the engine seam from ``kv_events_port``) and runs a small cache (``--num-gpu-blocks-override``) so
  that it evicts; what the router predicts for a prompt it never routed is what the engine's ``cached_tokens``
  then says, the hybrid checkpoint rule included (run last but one: it fills that cache);
* over a real shaped link: the PrFaaS engine and the gateway run in region A's network namespace, the PD engines and
  the router in region B's, joined by a ``tbf``-shaped veth (:mod:`prfaas_local.netns`): the bytes the router and
  the gateway book for the remote requests are what crossed the veth by the kernel's counters (less the TCP/IP
  headers of its packets, with the control messages and the status polls bounded);
* the engine emulator (``prfaas engine`` given the same measured profile) against these engines: the same P/D
  exchanges (fresh, repeated, extended, sharing less than a checkpoint) count the same tokens by source and the
  same bytes.

Its own engine set (3 hybrid engines, ~7 GiB), started once and ended when the module ends, before the tier's
loopback set starts (conftest orders the module). Where network namespaces are refused (not root) the engines run
on the loopback and the veth case skips (fails under ``PRFAAS_REQUIRE_REAL=1``).
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from prfaas_core import names
from prfaas_core.api import ModelProfile
from prfaas_core.capacity.kv import kv_model_from_profile
from prfaas_core.launch.render import hybrid_fields
from prfaas_local.model_profile import check_profile, pd_exchange, transferred_bytes
from prfaas_local.netns import LinkShape, NetnsPair, NetnsUnavailable, Side
from prfaas_local.ports import free_port
from prfaas_local.procs import spawn_process, stop_processes
from prfaas_local.stack import LocalStack
from prfaas_local.vllm_engines import EnginePool, Prompts, RealEngine, RealEnginesUnavailable, RealEnv
from prfaas_router.state.metrics import sample_sum
from support.real_engines import skip_or_fail

THRESHOLD_TOKENS = 768
SHORT_TOKENS = 300
LONG_TOKENS = 1100
TOLERANCE = 0.02


PDP_BLOCKS = 48
"""The PD prefill engine's KV cache in blocks (all cache groups share them): a few 1,100-token prompts fill it."""

SHAPE = LinkShape(rate_mbit=200, burst_bytes=65_536, latency_ms=500)
"""The veth between the regions: 200 Mbit/s (a 1,100-token prompt's 861 KB cross in ≥ 34 ms)."""


@dataclass
class Hybrid:
    env: RealEnv
    profile: ModelProfile
    pool: EnginePool
    prfaas: RealEngine
    pdp: RealEngine
    pdd: RealEngine
    stack: LocalStack
    pair: NetnsPair | None
    netns_refused: str = ""


def _regions() -> tuple[NetnsPair | None, str]:
    pair = NetnsPair(SHAPE)
    try:
        pair.create()
    except NetnsUnavailable as exc:
        return None, str(exc)
    return pair, ""


def _start(pool: EnginePool, pair: NetnsPair | None, side: Side, name: str, role: str, **changes: Any) -> RealEngine:
    """An engine in ``side``'s namespace (its flags from the hybrid's profile: :meth:`EnginePool.spec`)."""
    if pair is None:
        return pool.start(name, pool.spec(role, **changes))
    addr = pair.addr(side)
    spec = pool.spec(role, host=addr, net_device=pair.dev(side), **changes)
    access = f"http://127.0.0.1:{pair.expose(side, addr, spec.port)}"
    return pool.start(name, spec, netns=pair.ns(side), host=addr, access=access)


def _in(pair: NetnsPair | None, side: Side) -> dict[str, Any]:
    """start_router's arguments that run a router in ``side``'s namespace (none on the loopback)."""
    if pair is None:
        return {}
    addr = pair.addr(side)
    access: Callable[[int], str] = lambda port: f"http://127.0.0.1:{pair.expose(side, addr, port)}"  # noqa: E731
    return {"prefix": pair.exec_prefix(side), "host": addr, "access": access}


@pytest.fixture(scope="module")
def hybrid(real_env: RealEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hybrid]:
    try:
        env = real_env.hybrid()
    except RealEnginesUnavailable as exc:
        skip_or_fail(str(exc))
        raise
    assert env.model_profile is not None
    profile = ModelProfile.model_validate({"metadata": {"name": "tiny-hybrid"}, "spec": env.model_profile})
    pool = EnginePool(env, tmp_path_factory.mktemp("hybrid-engines"))
    stack = LocalStack.over_vllm(tmp_path_factory.mktemp("hybrid-stack"), env)
    pair, refused = _regions()
    try:
        prfaas = _start(pool, pair, "a", "prfaas", "prfaas-prefill")
        small = ("--num-gpu-blocks-override", str(PDP_BLOCKS))  # it evicts after a few long prompts (issue 49)
        pdp = _start(pool, pair, "b", "pdp", "pd-prefill", kv_events_port=free_port(), extra_args=small)
        pdd = _start(pool, pair, "b", "pdd", "pd-decode")
        pool.wait_ready([prfaas, pdp, pdd])
        for producer in (prfaas, pdp):
            pool.warm_up(producer, pdd)
        stack.start_router("gateway", stack.make_gateway_config(prfaas), **_in(pair, "a"))
        stack.wait_ready("gateway")
        config = stack.make_router_config([pdp], [pdd], "gateway", THRESHOLD_TOKENS)
        stack.start_router("router", config, **_in(pair, "b"))
        stack.wait_ready("router")
        yield Hybrid(env, profile, pool, prfaas, pdp, pdd, stack, pair, refused)
    finally:
        stack.close()
        pool.close()
        if pair is not None:
            pair.close()


def _metric(url: str, name: str, headers: dict[str, str] | None = None) -> float:
    return sample_sum(httpx.get(url + "/metrics", headers=headers or {}, timeout=10).text, name, {}) or 0.0


def _booked(h: Hybrid) -> tuple[float, float]:
    """(the router's remote KV bytes, the gateway's egress bytes) so far."""
    router = _metric(h.stack.url("router"), names.METRIC_ROUTER_REMOTE_BYTES)
    gateway = _metric(h.stack.url("gateway"), names.METRIC_GATEWAY_KV_EGRESS_BYTES, h.stack.gateway_headers)
    return router, gateway


def _complete(h: Hybrid, prompt: str) -> httpx.Response:
    body = {"model": h.env.served_model_name, "prompt": prompt, "max_tokens": 4, "temperature": 0}
    r = httpx.post(h.stack.url("router") + "/v1/completions", json=body, timeout=180)
    assert r.status_code == 200, r.text
    return r


def _settled_transfer(engine: RealEngine, before: tuple[float, float]) -> float:
    """The bytes of the one transfer the decode engine counted since ``before`` (its metrics update lags)."""
    deadline = time.monotonic() + 30
    now = transferred_bytes(engine.reach_url)
    while now[1] < before[1] + 1:
        assert time.monotonic() < deadline, "the decode engine counted no KV transfer"
        time.sleep(0.2)
        now = transferred_bytes(engine.reach_url)
    assert now[1] == before[1] + 1, "more than one KV transfer for one request"
    return now[0] - before[0]


def test_the_engines_run_with_what_the_hybrid_profile_implies(hybrid: Hybrid) -> None:
    arch = hybrid.profile.spec.architecture
    assert arch is not None and arch.linear_kind == "GatedDeltaNet" and arch.linear_layers == 3
    launch = hybrid.pdd.launch  # EnginePool.spec adds hybrid_fields(profile): the flags a hybrid needs
    assert hybrid_fields(hybrid.profile) and all(
        getattr(hybrid.pdd.spec, k) == v for k, v in hybrid_fields(hybrid.profile).items()
    )
    assert "--dtype" in launch.argv and launch.argv[launch.argv.index("--dtype") + 1] == "bfloat16"
    assert ("VLLM_SSM_CONV_STATE_LAYOUT", "DS") in {(e.name, e.value) for e in launch.env}
    # vLLM enlarged the attention block to what the profile says (a page must hold a recurrent state)
    assert f"Setting attention block size to {arch.block_tokens} tokens" in hybrid.pdd.log.read_text()


@pytest.mark.parametrize(("tokens", "route"), [(SHORT_TOKENS, "local"), (LONG_TOKENS, "remote")])
def test_n_minus_1_and_the_booked_bytes_equal_what_vllm_transferred(hybrid: Hybrid, tokens: int, route: str) -> None:
    prompts = Prompts(hybrid.env.tokenizer_file)
    for _ in range(2):
        before_src = hybrid.pdd.prompt_tokens_by_source()
        before_bytes, before_booked = transferred_bytes(hybrid.pdd.reach_url), _booked(hybrid)
        r = _complete(hybrid, prompts.text(tokens))
        assert r.headers["x-prfaas-route"] == route
        n = r.json()["usage"]["prompt_tokens"]
        moved = _settled_transfer(hybrid.pdd, before_bytes)
        after_src = hybrid.pdd.prompt_tokens_by_source()
        got = {k: after_src[k] - before_src[k] for k in after_src}
        assert got == {"external_kv_transfer": n - 1, "local_compute": 1, "local_cache_hit": 0}, (n, got)
        predicted = kv_model_from_profile(hybrid.profile.spec).pulled_kv_bytes(n)
        assert abs(predicted - moved) <= TOLERANCE * moved, (n, predicted, moved)
        router, gateway = (a - b for a, b in zip(_booked(hybrid), before_booked, strict=True))
        print(f"\n{route} {n} tokens: vLLM transferred {moved:.0f} B; router {router:.0f} B, gateway {gateway:.0f} B")
        if route == "remote":
            assert abs(router - moved) <= TOLERANCE * moved, (router, moved)
            assert abs(gateway - moved) <= TOLERANCE * moved, (gateway, moved)
        else:
            assert router == gateway == 0


def test_a_prompt_the_decode_holds_is_booked_without_what_it_reuses(hybrid: Hybrid) -> None:
    """A remote prompt again, then extended, then one that shares ~600 of its tokens: the decode reuses every
    whole block it holds (of the first prompt's N-1 tokens; it pulls the state in full, so it needs none at the
    hit) and pulls the rest plus the state; the router and the gateway book exactly that."""
    prompts = Prompts(hybrid.env.tokenizer_file, seed=1048)
    first = prompts.text(LONG_TOKENS)
    shares = first[: len(first) * 6 // 11] + " " + prompts.text(500)  # ~600 tokens in common: 2 whole blocks
    block = hybrid.profile.spec.architecture.block_tokens  # type: ignore[union-attr]
    for i, text in enumerate((first, first, first + " " + prompts.text(100), shares)):
        before_src = hybrid.pdd.prompt_tokens_by_source()
        before_bytes, before_booked = transferred_bytes(hybrid.pdd.reach_url), _booked(hybrid)
        r = _complete(hybrid, text)
        assert r.headers["x-prfaas-route"] == "remote"
        n = r.json()["usage"]["prompt_tokens"]
        moved = _settled_transfer(hybrid.pdd, before_bytes)
        after_src = hybrid.pdd.prompt_tokens_by_source()
        got = {k: after_src[k] - before_src[k] for k in after_src}
        reused = got["local_cache_hit"]
        assert got["external_kv_transfer"] + reused == n - 1 and got["local_compute"] == 1, got
        if i == 0:
            assert reused == 0
            held = (n - 1) // block * block
        else:
            assert reused == (held if i < 3 else 2 * block), (i, reused, held)
        router, gateway = (a - b for a, b in zip(_booked(hybrid), before_booked, strict=True))
        print(
            f"\nremote {n} tokens, {reused:.0f} reused: vLLM {moved:.0f} B; "
            f"router {router:.0f} B, gateway {gateway:.0f} B"
        )
        assert abs(router - moved) <= TOLERANCE * moved, (router, moved)
        assert abs(gateway - moved) <= TOLERANCE * moved, (gateway, moved)


def test_the_profile_predicts_the_transferred_bytes_at_held_back_lengths(hybrid: Hybrid) -> None:
    prompts = Prompts(hybrid.env.tokenizer_file, seed=48)
    texts = [prompts.text(n) for n in (200, 500, 900, 1500)]
    checked = check_profile(
        hybrid.profile, hybrid.pdp.reach_url, hybrid.pdd.reach_url, texts, hybrid.env.served_model_name
    )
    for c in checked:
        print(f"\n{c.prompt_tokens} tokens: predicted {c.predicted_bytes:.0f} B, transferred {c.measured_bytes:.0f} B")
    assert all(abs(c.error) <= TOLERANCE for c in checked), checked


HEADER_BYTES = 66
"""Ethernet 14 + IPv4 20 + TCP 20 + timestamps 12: one set per packet the veth counts (GSO packets included)."""
PER_REQUEST_BYTES = 24_576
"""A→B besides the KV, per request: the gateway's answer to the router (the KV handle), UCX's and NIXL's own
messages around a pull (measured ~1-2 KiB on the dense tier), with room."""
BACKGROUND_BYTES_PER_S = 4_096
"""The gateway's /status answers to the router's polls and TCP keep-alives."""


def test_the_booked_bytes_are_what_crossed_the_shaped_veth(hybrid: Hybrid) -> None:
    """Region A (PrFaaS engine, gateway) to region B (PD engines, router) over the tbf veth: for fresh remote
    prompts, the router's and the gateway's booked bytes equal vLLM's transferred bytes (±2 %), and the veth's
    payload (its kernel byte counter less the TCP/IP headers of its packets) is those bytes plus no more than the
    requests' control messages and the status polls."""
    pair = hybrid.pair
    if pair is None:
        skip_or_fail(f"network namespaces refused: {hybrid.netns_refused}")
        return
    prompts = Prompts(hybrid.env.tokenizer_file, seed=4802)
    lengths = (900, LONG_TOKENS, 1500)
    before_link, before_booked, shaped = pair.counters("a"), _booked(hybrid), pair.qdisc("a").get("bytes", 0)
    started, moved = time.monotonic(), 0.0
    for tokens in lengths:
        before_bytes = transferred_bytes(hybrid.pdd.reach_url)
        r = _complete(hybrid, prompts.text(tokens))
        assert r.headers["x-prfaas-route"] == "remote", dict(r.headers)
        moved += _settled_transfer(hybrid.pdd, before_bytes)
    elapsed = time.monotonic() - started
    link = pair.counters("a") - before_link
    router, gateway = (a - b for a, b in zip(_booked(hybrid), before_booked, strict=True))
    payload = link.tx_bytes - HEADER_BYTES * link.tx_packets
    slack = PER_REQUEST_BYTES * len(lengths) + BACKGROUND_BYTES_PER_S * elapsed
    print(
        f"\nveth A→B {link.tx_bytes} B in {link.tx_packets} packets (payload ~{payload} B); vLLM transferred "
        f"{moved:.0f} B; router {router:.0f} B, gateway {gateway:.0f} B; payload/booked {payload / router:.4f}; "
        f"kernel/booked {link.tx_bytes / router:.4f}; {elapsed:.1f} s"
    )
    assert abs(router - moved) <= TOLERANCE * moved and abs(gateway - moved) <= TOLERANCE * moved, (router, moved)
    assert router <= payload <= router + slack, (payload, router, slack)
    assert pair.qdisc("a").get("bytes", 0) - shaped >= moved, "the KV did not pass the veth's tbf"


EMULATOR = [sys.executable, "-m", "prfaas_cli.main", "engine", "--block-size", "128", "--byte-scale", "1"]


@pytest.fixture
def emulated(hybrid: Hybrid, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """An emulated prefill and decode engine given the measured profile (a ModelProfile file)."""
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump(hybrid.profile.model_dump(mode="json", by_alias=True, exclude_none=True)))
    urls, procs = [], []
    for role in ("prefill", "decode"):
        port = free_port()
        argv = [*EMULATOR, "--role", role, "--port", str(port), "--kv-listen", f"127.0.0.1:{free_port()}"]
        argv += ["--model-profile", str(profile), "--model", hybrid.env.served_model_name, "--time-scale", "100"]
        procs.append(spawn_process(argv, tmp_path / f"{role}.log"))
        urls.append(f"http://127.0.0.1:{port}")
    try:
        for url in urls:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, f"the emulated engine at {url} did not start"
                time.sleep(0.1)
        yield urls[0], urls[1]
    finally:
        stop_processes(procs)


def test_the_emulator_with_the_measured_profile_counts_what_the_real_hybrid_counts(
    hybrid: Hybrid, emulated: tuple[str, str]
) -> None:
    """The same P/D exchanges (token ids, so both count the same prompt) on the real pair and on the emulated one:
    a fresh prompt, the same again, one that shares two whole blocks but less than the first one's checkpoint, and
    the first one extended. vLLM is the reference: the decode's tokens by source and bytes agree (it reuses every
    whole block it holds: it pulls the state in full), and so do the prefill's (a local prefill resumes at a
    checkpoint only)."""
    rng = random.Random(4803)
    first = [rng.randrange(10, 2000) for _ in range(1080)]
    shares = first[:600] + [rng.randrange(10, 2000) for _ in range(480)]
    extended = first + [rng.randrange(10, 2000) for _ in range(100)]
    model = hybrid.env.served_model_name
    for prompt in (first, first, shares, extended):
        real = pd_exchange(hybrid.pdp.reach_url, hybrid.pdd.reach_url, prompt, model)
        emu = pd_exchange(*emulated, prompt, model)
        print(f"\n{len(prompt)} tokens: vLLM {real}\n{' ' * len(str(len(prompt)))}  emulator {emu}")
        assert real.prompt_tokens == emu.prompt_tokens == len(prompt)
        assert emu.by_source == real.by_source, (len(prompt), real, emu)
        assert emu.prefill_by_source == real.prefill_by_source, (len(prompt), real, emu)
        assert emu.transferred_bytes == real.transferred_bytes, (len(prompt), real, emu)


def _router(h: Hybrid, name: str, labels: dict[str, str]) -> float:
    return sample_sum(httpx.get(h.stack.url("router") + "/metrics", timeout=10).text, name, labels) or 0.0


def _direct(engine: RealEngine, h: Hybrid, text: str) -> int:
    """``text`` sent to ``engine`` itself (the router never sees it); its prompt tokens."""
    body = {"model": h.env.served_model_name, "prompt": text, "max_tokens": 1, "temperature": 0}
    r = httpx.post(engine.reach_url + "/v1/completions", json=body, timeout=180)
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["prompt_tokens"])


def _until(cond: Callable[[], bool], what: str, timeout_s: float = 30) -> float:
    """Seconds until ``cond`` held (polled)."""
    start = time.monotonic()
    while not cond():
        assert time.monotonic() - start < timeout_s, what
        time.sleep(0.05)
    return time.monotonic() - start


def test_the_router_predicts_the_engines_own_hits_from_its_kv_events(hybrid: Hybrid) -> None:
    """A prompt sent to the PD prefill engine directly: the router learns its blocks from the engine's events and
    predicts the hit at the checkpoint (the last whole block of N-1), a prompt whose only shared checkpoint is
    another prompt's unique tokens as 0, and after the engine evicted a prompt's blocks, nothing for it; each time
    the engine's ``cached_tokens`` agrees and the router's not-honoured counter stays 0."""
    h, pdp = hybrid, hybrid.pdp.name
    prompts = Prompts(h.env.tokenizer_file, seed=4049)
    block = h.profile.spec.architecture.block_tokens  # type: ignore[union-attr]
    hit = {"cluster": "pd", "cache_kind": "recurrent"}
    unhonoured = {"cluster": "pd"}
    stored = {"engine": pdp, "event": "stored"}
    removed = {"engine": pdp, "event": "removed"}

    def through_router(text: str) -> tuple[float, int, str]:
        """(the router's predicted PD hit, what the PD prefill engine reused of it, the route) of ``text``. The route
        is the router's to choose (a stale load reading of the engine may spill it remote): where it did not go to
        the engine, the engine is asked directly, so its own count confirms the prediction either way."""
        before = _router(h, names.METRIC_ROUTER_PREFIX_HIT_TOKENS, hit)
        r = _complete(h, text)
        predicted = _router(h, names.METRIC_ROUTER_PREFIX_HIT_TOKENS, hit) - before
        route = r.headers["x-prfaas-route"]
        if route != "local":
            body = {"model": h.env.served_model_name, "prompt": text, "max_tokens": 1}
            r = httpx.post(h.pdp.reach_url + "/v1/completions", json=body, timeout=180)
        return predicted, r.json()["usage"]["prompt_tokens_details"]["cached_tokens"], route

    def sent_direct(text: str) -> int:
        seen = _router(h, names.METRIC_ROUTER_KV_EVENT_BLOCKS, stored)
        n = _direct(h.pdp, h, text)
        delay = _until(lambda: _router(h, names.METRIC_ROUTER_KV_EVENT_BLOCKS, stored) > seen, "no event reached it")
        print(f"\nthe router's index had the engine's blocks {delay:.3f} s after its answer (polled at 50 ms)")
        return n

    not_honoured = _router(h, names.METRIC_ROUTER_PREFIX_UNHONOURED_TOKENS, unhonoured)
    # 1. the repeated ~1,081-token prompt: a hit at the checkpoint, not at the last attention block
    a = prompts.text(1081)
    n = sent_direct(a)
    predicted, cached, _ = through_router(a)  # uncached 57 < t: local (unless the router saw a queue there)
    assert predicted == cached == (n - 1) // block * block, (predicted, cached, n)
    # 2. a prompt sharing ~600 tokens (2 blocks) with one whose only checkpoint lies in that one's unique tokens:
    # 0 (the attention blocks alone would say 512), and the engine reuses nothing
    shared = prompts.text(600)
    sent_direct(shared + " " + prompts.text(480))
    predicted, cached, _ = through_router(shared + " " + prompts.text(100))
    assert predicted == cached == 0, (predicted, cached)
    # 3. fill the small cache until the engine must have evicted; the router's index drops the evicted blocks
    evicted = _router(h, names.METRIC_ROUTER_KV_EVENT_BLOCKS, removed)
    # each fresh prompt stores at least its 4 attention blocks: after this many, every block older than them (the
    # first prompt's included) has made room
    for _ in range(PDP_BLOCKS // (1081 // block) + 1):
        _direct(h.pdp, h, prompts.text(1081))
    _until(lambda: _router(h, names.METRIC_ROUTER_KV_EVENT_BLOCKS, removed) > evicted, "no eviction reached the router")
    # its blocks were the oldest, evicted first: the router predicts nothing there, and the engine reuses nothing
    predicted, cached, _ = through_router(a)
    assert predicted == cached == 0, (predicted, cached)
    assert _router(h, names.METRIC_ROUTER_PREFIX_UNHONOURED_TOKENS, unhonoured) == not_honoured


def test_a_dead_prfaas_engine_falls_back_to_the_local_path_and_n_minus_1_still_holds(hybrid: Hybrid) -> None:
    """Last in the module: the PrFaaS engine stays dead."""
    hybrid.pool.stop("prfaas")
    prompts = Prompts(hybrid.env.tokenizer_file)
    before = hybrid.pdd.prompt_tokens_by_source()
    r = _complete(hybrid, prompts.text(LONG_TOKENS))
    # local once the router has seen the gateway report its engine gone; a fallback (the remote leg failed, the
    # local path prefilled it) before that: either way the local path served it
    assert r.headers["x-prfaas-route"] in ("local", "fallback"), dict(r.headers)
    n = r.json()["usage"]["prompt_tokens"]
    after = hybrid.pdd.prompt_tokens_by_source()
    assert after["external_kv_transfer"] - before["external_kv_transfer"] == n - 1
    assert after["local_compute"] - before["local_compute"] == 1
