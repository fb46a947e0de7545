"""Disaggregated serving between two emulated engines (in-process, real sockets): vLLM's kv_transfer_params
protocol and SGLang's bootstrap protocol, with the KV really pulled over TCP, and the error cases."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from testbed_support import await_for, free_port, metric_value, serving, sse_payloads

from prfaas_core.launch.emulation import ScaleSettings
from prfaas_engine import ENGINE_KEY, EngineConfig, HostPort, create_app
from prfaas_engine.batching import kv_pull_tokens
from prfaas_engine.engine import Engine

SCALE = ScaleSettings(time_scale=200, byte_scale=1e-3)
PREFILL_LEG = {  # exactly what vllm-router 0.1.17 adds to the prefill leg
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


@dataclass
class Pair:
    prefill: aiohttp.ClientSession
    decode: aiohttp.ClientSession
    prefill_engine: Engine
    decode_engine: Engine


@pytest.fixture
async def pair(request: pytest.FixtureRequest) -> AsyncIterator[Pair]:
    overrides: dict[str, Any] = {"bootstrap_wait_s": 0.5, **getattr(request, "param", {})}
    details = {"enable_prompt_tokens_details": True}
    papp = create_app(EngineConfig(role="prefill", port=0, scale=SCALE, **details, **overrides))
    dapp = create_app(EngineConfig(role="decode", port=0, scale=SCALE, bootstrap_wait_s=0.5, **details))
    async with (
        serving(papp) as purl,
        serving(dapp) as durl,
        aiohttp.ClientSession(purl) as p,
        aiohttp.ClientSession(durl) as d,
    ):
        yield Pair(p, d, papp[ENGINE_KEY], dapp[ENGINE_KEY])


async def post(client: aiohttp.ClientSession, path: str, body: Any) -> tuple[int, Any]:
    async with client.post(path, json=body) as resp:
        return resp.status, await resp.json()


async def metrics_text(client: aiohttp.ClientSession) -> str:
    async with client.get("/metrics") as resp:
        return await resp.text()


def expected_wire_bytes(engine: Engine, prompt_tokens: int) -> int:
    whole = kv_pull_tokens(prompt_tokens, engine.config.block_size_tokens)  # whole blocks, as vLLM moves them
    return SCALE.wire_bytes(engine.config.kv_model.kv_bytes(whole))


async def test_vllm_protocol_moves_the_kv_and_frees_it(pair: Pair) -> None:
    prompt = "q" * 8000  # 2000 tokens
    status, pre = await post(
        pair.prefill, "/v1/completions", {"prompt": prompt, "max_tokens": 1, "kv_transfer_params": PREFILL_LEG}
    )
    assert status == 200 and pre["usage"]["completion_tokens"] == 1
    kv = pre["kv_transfer_params"]
    assert kv["do_remote_prefill"] is True and kv["do_remote_decode"] is False
    assert kv["remote_engine_id"] == pair.prefill_engine.config.engine_id
    assert kv["remote_block_ids"] and len(kv["remote_block_ids"]) == 2000 // 16
    assert f"{kv['remote_host']}:{kv['remote_port']}" == str(pair.prefill_engine.kv_listen)
    assert pair.prefill_engine.snapshot()["kv_handles"] == 1
    assert pair.prefill_engine.core.used_blocks > 0  # held for the decode

    body = {"prompt": prompt, "max_tokens": 6, "stream": True, "kv_transfer_params": kv}
    async with pair.decode.post("/v1/completions", json=body) as resp:
        assert resp.status == 200
        events = sse_payloads(await resp.text())
    assert events[-1] == "[DONE]" and len([e for e in events[:-1] if e["choices"][0]["text"]]) == 6

    model_bytes = SCALE.model_bytes(expected_wire_bytes(pair.prefill_engine, 2000))
    assert metric_value(await metrics_text(pair.prefill), "prfaas_engine_kv_bytes_sent_total") == model_bytes
    assert metric_value(await metrics_text(pair.decode), "prfaas_engine_kv_bytes_received_total") == model_bytes
    assert pair.prefill_engine.snapshot()["kv_handles"] == 0
    assert pair.prefill_engine.core.used_blocks == 0

    status, again = await post(pair.decode, "/v1/completions", {"prompt": prompt, "kv_transfer_params": kv})
    assert status == 404 and "already pulled" in again["error"]["message"]


async def test_a_decode_leg_reports_what_the_prefill_side_reused(pair: Pair) -> None:
    """vLLM 0.32 (seen on real engines): the prefill answer's handle carries ``remote_prefill_cached_tokens`` (its
    prefix-cache hits) and the decode reports that as its ``cached_tokens``, not its own full hit from the pull;
    a handle without the field reports every prompt token."""
    prompt = "r" * 4000  # 1000 tokens
    leg = {"prompt": prompt, "max_tokens": 1, "kv_transfer_params": PREFILL_LEG}
    seen = []
    for remove in (False, False, True):
        _, pre = await post(pair.prefill, "/v1/completions", leg)
        kv = pre["kv_transfer_params"]
        assert kv["remote_prefill_cached_tokens"] == pre["usage"]["prompt_tokens_details"]["cached_tokens"]
        if remove:
            kv = {k: v for k, v in kv.items() if k != "remote_prefill_cached_tokens"}
        body = {"prompt": prompt, "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}
        async with pair.decode.post("/v1/completions", json={**body, "kv_transfer_params": kv}) as resp:
            events = sse_payloads(await resp.text())
        seen.append(events[-2]["usage"]["prompt_tokens_details"])
    assert seen == [{"cached_tokens": 0}, {"cached_tokens": 1000 // 16 * 16}, {"cached_tokens": 1000}]


async def test_a_rejected_decode_leg_releases_the_producers_kv(pair: Pair) -> None:
    """The router's release leg (a decode leg carrying the handle that the consumer rejects) frees the producer's
    KV at once, moving no bytes, as vLLM 0.32's consumer does for a request its serving layer rejects."""
    from prfaas_router.path.call import release_body

    _, pre = await post(
        pair.prefill, "/v1/completions", {"prompt": "v" * 4000, "max_tokens": 1, "kv_transfer_params": PREFILL_LEG}
    )
    eng = pair.prefill_engine
    assert eng.snapshot()["kv_handles"] == 1 and eng.core.used_blocks > 0
    status, body = await post(pair.decode, "/v1/completions", release_body(pre["kv_transfer_params"]))
    assert status == 400 and "max_tokens" in body["error"]["message"]
    await await_for(lambda: eng.snapshot()["kv_handles"] == 0 and eng.core.used_blocks == 0, 10, "the KV released")
    text = await metrics_text(pair.prefill)
    assert metric_value(text, "prfaas_engine_kv_bytes_sent_total") == 0
    assert metric_value(text, "prfaas_engine_kv_expired_total") == 0


async def test_unknown_engine_and_unreachable_kv_server_are_errors(pair: Pair) -> None:
    _, pre = await post(
        pair.prefill, "/v1/completions", {"prompt": "abc", "max_tokens": 1, "kv_transfer_params": PREFILL_LEG}
    )
    kv = pre["kv_transfer_params"]
    status, body = await post(
        pair.decode, "/v1/completions", {"prompt": "abc", "kv_transfer_params": {**kv, "remote_engine_id": "other"}}
    )
    assert status == 404 and "unknown remote_engine_id 'other'" in body["error"]["message"]
    status, body = await post(
        pair.decode, "/v1/completions", {"prompt": "abc", "kv_transfer_params": {**kv, "remote_port": free_port()}}
    )
    assert status == 502 and "KV pull from" in body["error"]["message"]
    assert pair.decode_engine.core.used_blocks == 0
    status, body = await post(pair.decode, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "x"}], "stream": True,
        "kv_transfer_params": {**kv, "remote_block_ids": [10**9]},
    })  # fmt: skip
    assert status == 404  # a stream that fails before its first token is still an HTTP error


@pytest.mark.parametrize("pair", [{"kv_timeout_s": 0.3}], indirect=True)
async def test_kv_never_pulled_is_freed_after_the_timeout(pair: Pair) -> None:
    _, pre = await post(
        pair.prefill, "/v1/completions", {"prompt": "w" * 400, "max_tokens": 1, "kv_transfer_params": PREFILL_LEG}
    )
    eng = pair.prefill_engine
    await await_for(lambda: eng.snapshot()["kv_handles"] == 0 and eng.core.used_blocks == 0, 10, "the KV expired")
    assert metric_value(await metrics_text(pair.prefill), "prfaas_engine_kv_expired_total") == 1
    status, body = await post(
        pair.decode, "/v1/completions", {"prompt": "w" * 400, "kv_transfer_params": pre["kv_transfer_params"]}
    )
    assert status == 404 and "expired" in body["error"]["message"]


async def test_sglang_protocol_sends_both_legs_at_once(pair: Pair) -> None:
    kv_port = pair.prefill_engine.kv_listen
    assert kv_port is not None
    body = {"prompt": "s" * 4000, "max_tokens": 4, "bootstrap_host": "127.0.0.1", "bootstrap_port": kv_port.port}
    body["bootstrap_room"] = 2**64 - 1
    (ds, decoded), (ps, prefilled) = await asyncio.gather(
        post(pair.decode, "/v1/completions", body), post(pair.prefill, "/v1/completions", body)
    )
    assert (ds, ps) == (200, 200)
    assert decoded["usage"]["completion_tokens"] == 4 and prefilled["usage"]["completion_tokens"] == 1
    model_bytes = SCALE.model_bytes(expected_wire_bytes(pair.prefill_engine, 1000))
    assert metric_value(await metrics_text(pair.decode), "prfaas_engine_kv_bytes_received_total") == model_bytes


async def test_sglang_decode_without_a_prefill_times_out_with_an_error(pair: Pair) -> None:
    kv = pair.prefill_engine.kv_listen
    assert kv is not None
    body = {"prompt": "x", "bootstrap_host": kv.host, "bootstrap_port": kv.port, "bootstrap_room": 42}
    status, answer = await post(pair.decode, "/v1/completions", body)
    assert status == 404 and "bootstrap room 42" in answer["error"]["message"]


async def test_duplicate_bootstrap_room_is_a_conflict(pair: Pair) -> None:
    body = {"prompt": "x", "bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": 7}
    assert (await post(pair.prefill, "/v1/completions", body))[0] == 200
    status, answer = await post(pair.prefill, "/v1/completions", body)
    assert status == 409 and "already held" in answer["error"]["message"]


async def test_advertised_kv_address_differs_from_where_it_listens() -> None:
    listen, advertise = HostPort("127.0.0.1", free_port()), HostPort("127.0.0.1", free_port())
    app = create_app(EngineConfig(role="prefill", port=0, scale=SCALE, kv_listen=listen, kv_advertise=advertise))
    async with serving(app) as url, aiohttp.ClientSession(url) as client:
        _, pre = await post(
            client, "/v1/completions", {"prompt": "x", "max_tokens": 1, "kv_transfer_params": PREFILL_LEG}
        )
        assert (pre["kv_transfer_params"]["remote_host"], pre["kv_transfer_params"]["remote_port"]) == (
            advertise.host,
            advertise.port,
        )
        assert app[ENGINE_KEY].kv_listen == listen


async def test_a_hybrid_pull_follows_the_n_minus_1_rule_and_carries_the_state() -> None:
    """A hybrid profile (Qwen3.5: 15 full-attention + 45 gated-DeltaNet layers): the decode pulls N-1 tokens' KV and
    computes the last token itself, and the bytes are whole blocks of N-1 tokens plus the recurrent state, as vLLM
    0.32 does for a hybrid (tests/real/test_real_hybrid.py)."""
    common: dict[str, Any] = {"scale": SCALE, "bootstrap_wait_s": 0.5, "model_profile": "qwen3.5-397b-a17b"}
    papp = create_app(EngineConfig(role="prefill", port=0, enable_prompt_tokens_details=True, **common))
    dapp = create_app(EngineConfig(role="decode", port=0, **common))
    async with (
        serving(papp) as purl,
        serving(dapp) as durl,
        aiohttp.ClientSession(purl) as p,
        aiohttp.ClientSession(durl) as d,
    ):
        prompt = "q" * 8004  # 2001 tokens: N-1 fills whole blocks, N starts one more
        status, pre = await post(
            p, "/v1/completions", {"prompt": prompt, "max_tokens": 1, "kv_transfer_params": PREFILL_LEG}
        )
        assert status == 200
        n = pre["usage"]["prompt_tokens"]
        status, _ = await post(
            d, "/v1/completions", {"prompt": prompt, "max_tokens": 2, "kv_transfer_params": pre["kv_transfer_params"]}
        )
        assert status == 200
        text = await metrics_text(d)
        by_source = {
            s: metric_value(text, "vllm:prompt_tokens_by_source_total", {"source": s})
            for s in ("external_kv_transfer", "local_compute")
        }
        assert by_source == {"external_kv_transfer": n - 1, "local_compute": 1}
        engine = papp[ENGINE_KEY]
        kv = engine.config.kv_model.with_default_blocks(engine.config.block_size_tokens)
        assert kv.recurrent and kv.fixed_bytes > 0
        sent = metric_value(await metrics_text(p), "prfaas_engine_kv_bytes_sent_total")
        assert sent == SCALE.model_bytes(SCALE.wire_bytes(kv.pulled_kv_bytes(n)))
        assert sent < SCALE.model_bytes(SCALE.wire_bytes(kv.block_kv_bytes(n)))  # not the dense rule


TINY_HYBRID = {  # the tiny Qwen3-Next's measured profile (``prfaas profile``, --block-size 128 on vLLM's CPU build)
    "architecture": {
        "fullAttentionLayers": 1,
        "kvHeads": 2,
        "headDim": 64,
        "kvDtype": "bf16",
        "linearLayers": 3,
        "linearStateBytesPerLayer": 68_608,
        "linearKind": "GatedDeltaNet",
        "blockTokens": 256,
    }
}


async def test_a_measured_hybrid_profile_reuses_what_the_decode_holds_and_moves_the_state_in_full() -> None:
    """The emulator with a measured profile (not a built-in one), byte for byte against what vLLM 0.32 transferred
    for the tiny Qwen3-Next (tests/unit/test_hybrid.py's MEASURED; tests/real/test_real_hybrid.py runs the same
    scenario on both): a fresh 1,080-token prompt moves 861,184 B; the same again reuses the decode's 1,024 tokens
    and moves 55 tokens' block plus the whole state, 336,896 B; a prompt that shares 600 tokens reuses its two whole
    blocks (the decode pulls the state in full: it needs none at the hit), 599,040 B."""
    from prfaas_core.api.model_profile import ModelProfileSpec

    spec = ModelProfileSpec.model_validate(TINY_HYBRID)
    common: dict[str, Any] = {
        "scale": ScaleSettings(time_scale=200, byte_scale=1.0),
        "bootstrap_wait_s": 0.5,
        "model_profile": "tiny-hybrid",
        "model_profile_spec": spec,
        "block_size_tokens": 128,  # vLLM's --block-size; the profile's blockTokens (256) is the block used
    }
    papp = create_app(EngineConfig(role="prefill", port=0, **common))
    dapp = create_app(EngineConfig(role="decode", port=0, **common))
    first = [10 + (i * 7919) % 2000 for i in range(1080)]
    shares_600 = first[:600] + [3000 + i for i in range(480)]
    extended = first + [2500 + i for i in range(100)]
    expected = [  # prompt -> (external_kv_transfer, local_compute, local_cache_hit), bytes moved
        (first, (1079, 1, 0), 861_184),
        (first, (55, 1, 1024), 336_896),
        (shares_600, (567, 1, 512), 599_040),
        (extended, (155, 1, 1024), 336_896),
    ]
    async with (
        serving(papp) as purl,
        serving(dapp) as durl,
        aiohttp.ClientSession(purl) as p,
        aiohttp.ClientSession(durl) as d,
    ):
        assert dapp[ENGINE_KEY].config.block_tokens == 256
        prefill_seen: list[tuple[float, float]] = []
        sources = ("external_kv_transfer", "local_compute", "local_cache_hit")
        for prompt, counts, moved in expected:
            before_text = await metrics_text(d)
            status, pre = await post(
                p, "/v1/completions", {"prompt": prompt, "max_tokens": 1, "kv_transfer_params": PREFILL_LEG}
            )
            assert status == 200
            body = {"prompt": prompt, "max_tokens": 2, "kv_transfer_params": pre["kv_transfer_params"]}
            status, _ = await post(d, "/v1/completions", body)
            assert status == 200
            after_text = await metrics_text(d)

            texts = (before_text, after_text)
            got = tuple(_grew(*texts, "vllm:prompt_tokens_by_source_total", {"source": s}) for s in sources)
            produced = await metrics_text(p)
            # the producer counts N-1 prompt tokens (the decode computes the last), its hit only at a checkpoint
            prefill_hit = metric_value(produced, "vllm:prompt_tokens_by_source_total", {"source": "local_cache_hit"})
            prefill_all = metric_value(produced, "vllm:prompt_tokens_by_source_total")
            prefill_seen.append((prefill_all - sum(p for p, _ in prefill_seen), prefill_hit))
            assert got == counts, (len(prompt), got)
            assert _grew(*texts, "vllm:nixl_bytes_transferred_sum") == moved, len(prompt)
        counted = [n for n, _ in prefill_seen]
        hits = [hit for _, hit in prefill_seen]
        assert counted == [1079, 1079, 1079, 1179]
        assert [b - a for a, b in zip([0.0, *hits], hits, strict=False)] == [0, 1024, 0, 1024]


def _grew(before: str, after: str, name: str, labels: dict[str, str] | None = None) -> float:
    return metric_value(after, name, labels or {}) - metric_value(before, name, labels or {})
