"""The engine emulator's OpenAI API, metrics and batching, on real sockets (in-process aiohttp server)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from testbed_support import await_for, metric_value, serving, sse_payloads

from prfaas_core.launch.emulation import ScaleSettings
from prfaas_core.request.tokens import OUTPUT_WORDS, render_chat
from prfaas_engine import ENGINE_KEY, EngineConfig, create_app
from prfaas_engine.engine import Engine
from prfaas_engine.timing import ServiceTimes

FAST = ScaleSettings(time_scale=1000, byte_scale=1e-3)
MODEL = "test-model"
Client = tuple[aiohttp.ClientSession, Engine]


@pytest.fixture
async def engine() -> AsyncIterator[Client]:
    config = EngineConfig(role="both", port=0, scale=FAST, served_model_name=MODEL, enable_prompt_tokens_details=True)
    app = create_app(config)
    async with serving(app) as url, aiohttp.ClientSession(url) as client:
        yield client, app[ENGINE_KEY]


async def test_prompt_tokens_details_are_null_without_the_flag_as_in_vllm() -> None:
    app = create_app(EngineConfig(role="both", port=0, scale=FAST))
    async with serving(app) as url, aiohttp.ClientSession(url) as client:
        status, answer = await post(client, "/v1/completions", {"prompt": "abc " * 50, "max_tokens": 1})
    assert status == 200 and answer["usage"]["prompt_tokens_details"] is None


async def post(client: aiohttp.ClientSession, path: str, body: Any) -> tuple[int, Any]:
    async with client.post(path, json=body) as resp:
        return resp.status, await resp.json()


async def metrics(client: aiohttp.ClientSession) -> str:
    async with client.get("/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        return await resp.text()


async def test_completion_returns_tokens_and_usage(engine: Client) -> None:
    client, _ = engine
    status, body = await post(client, "/v1/completions", {"model": "any-name", "prompt": "x" * 400, "max_tokens": 5})
    assert status == 200
    assert body["object"] == "text_completion" and body["model"] == "any-name"
    assert body["choices"][0]["text"] == "".join(OUTPUT_WORDS[:5])
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] == 100 and body["usage"]["completion_tokens"] == 5
    assert body["usage"]["total_tokens"] == 105
    assert "kv_transfer_params" not in body


async def test_chat_stream_with_usage(engine: Client) -> None:
    client, _ = engine
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say four words."}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 4, "stream": True}
    body["stream_options"] = {"include_usage": True}
    async with client.post("/v1/chat/completions", json=body) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"] == "text/event-stream"
        events = sse_payloads(await resp.text())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert content == "".join(OUTPUT_WORDS[:4])
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4
    assert usage["usage"]["prompt_tokens"] == math.ceil(len(render_chat(messages)) / 4)


async def test_completion_stream_without_usage_ends_with_done(engine: Client) -> None:
    client, _ = engine
    async with client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 3, "stream": True}) as resp:
        events = sse_payloads(await resp.text())
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "".join(OUTPUT_WORDS[:3])
    assert all("usage" not in e for e in events[:-1])


async def test_discovery_health_and_render(engine: Client) -> None:
    client, _ = engine
    async with client.get("/v1/models") as resp:
        models = await resp.json()
    assert models["object"] == "list" and models["data"][0]["id"] == MODEL
    for path in ("/health", "/ping"):
        async with client.get(path) as resp:
            assert resp.status == 200
    async with client.get("/version") as resp:
        assert "version" in await resp.json()
    status, rendered = await post(client, "/v1/completions/render", {"model": MODEL, "prompt": "abcdefgh"})
    assert status == 200 and isinstance(rendered, list) and len(rendered[0]["token_ids"]) == 2
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}
    status, rendered = await post(client, "/v1/chat/completions/render", chat)
    assert status == 200 and len(rendered["token_ids"]) == math.ceil(len(render_chat(chat["messages"])) / 4)


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/completions", {"model": MODEL}, "prompt"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "n": 3}, "one choice"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 10**7}, "maximum context length"),
        ("/v1/chat/completions", {"messages": []}, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "content"),
        ("/v1/completions", {"prompt": "hi", "kv_transfer_params": [1]}, "kv_transfer_params"),
        ("/v1/completions", {"prompt": "hi", "bootstrap_room": 1, "bootstrap_host": "h", "bootstrap_port": 1}, "both"),
        ("/v1/completions/render", {"prompt": ""}, "empty"),
    ],
)
async def test_bad_requests_are_400_with_a_clear_message(
    engine: Client, path: str, body: dict[str, Any], message: str
) -> None:
    client, _ = engine
    status, answer = await post(client, path, body)
    assert status == 400
    assert message in answer["error"]["message"]
    assert answer["error"]["type"] == "BadRequestError"


async def test_invalid_json_is_400(engine: Client) -> None:
    client, _ = engine
    async with client.post("/v1/completions", data=b"{not json", headers={"Content-Type": "application/json"}) as r:
        assert r.status == 400
        assert "valid JSON" in (await r.json())["error"]["message"]


async def test_metrics_use_vllm_names_types_and_labels(engine: Client) -> None:
    client, _ = engine
    await post(client, "/v1/completions", {"prompt": "x" * 400, "max_tokens": 5})
    text = await metrics(client)
    types = {f.name: f.type for f in text_string_to_metric_families(text)}
    expected = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:prefix_cache_queries": "counter",
        "vllm:prefix_cache_hits": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:request_time_per_output_token_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram",
        "prfaas_engine_kv_bytes_sent": "counter",
        "prfaas_engine_kv_bytes_received": "counter",
    }
    assert {name: types.get(name) for name in expected} == expected
    labels = {"model_name": MODEL, "engine": "0"}
    assert metric_value(text, "vllm:prompt_tokens_total", labels) == 100
    assert metric_value(text, "vllm:generation_tokens_total", labels) == 5
    assert metric_value(text, "vllm:time_to_first_token_seconds_count", labels) == 1
    assert metric_value(text, "vllm:inter_token_latency_seconds_count", labels) == 4
    assert metric_value(text, "vllm:request_time_per_output_token_seconds_count", labels) == 1
    assert "vllm:time_per_output_token_seconds" not in text  # gone from vLLM by 0.13
    assert metric_value(text, "vllm:request_success_total", {**labels, "finished_reason": "length"}) == 1
    assert metric_value(text, "vllm:num_requests_running", labels) == 0


async def test_ttft_is_at_least_the_profiles_prefill_time(engine: Client) -> None:
    client, eng = engine
    await post(client, "/v1/completions", {"prompt": "y" * 16000, "max_tokens": 1})
    ttft_sum = metric_value(await metrics(client), "vllm:time_to_first_token_seconds_sum")
    assert ttft_sum >= ServiceTimes(eng.config.hardware_profile).prefill_s(4000)


async def test_repeated_prefixes_hit_the_prefix_cache(engine: Client) -> None:
    client, _ = engine
    shared = "You are a helpful assistant. " * 100  # 2900 characters = 725 tokens
    _, first = await post(client, "/v1/completions", {"prompt": shared + "First question?", "max_tokens": 1})
    _, second = await post(client, "/v1/completions", {"prompt": shared + "Second question!", "max_tokens": 1})
    assert first["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 0,
        "created_cache_tokens": None,
        "multimodal_tokens": None,
    }  # vLLM 0.32's whole answer (a stream's usage chunk carries cached_tokens alone)
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == 725 // 16 * 16
    text = await metrics(client)
    assert metric_value(text, "vllm:prefix_cache_hits_total") == cached
    queried = first["usage"]["prompt_tokens"] + second["usage"]["prompt_tokens"]
    assert metric_value(text, "vllm:prefix_cache_queries_total") == queried


async def test_continuous_batching_caps_the_batch_and_queues_the_rest() -> None:
    config = EngineConfig(role="both", port=0, scale=ScaleSettings(time_scale=20), max_batch=2, max_waiting=3)
    app = create_app(config)
    async with serving(app) as url, aiohttp.ClientSession(url) as client:
        eng = app[ENGINE_KEY]
        body = {"prompt": "z" * 64, "max_tokens": 60}
        tasks = [asyncio.create_task(post(client, "/v1/completions", body)) for _ in range(5)]
        state = await await_for(
            lambda: (eng.snapshot()["running"], eng.snapshot()["waiting"]) == (2, 3), 10, "2 running, 3 waiting"
        )
        assert state
        text = await metrics(client)
        assert metric_value(text, "vllm:num_requests_running") == 2
        assert metric_value(text, "vllm:num_requests_waiting") == 3
        assert metric_value(text, "vllm:kv_cache_usage_perc") == pytest.approx(
            2 * math.ceil((16 + 60) / 16) / config.kv_cache_blocks
        )
        status, refused = await post(client, "/v1/completions", body)
        assert status == 503 and "waiting queue is full" in refused["error"]["message"]
        results = await asyncio.gather(*tasks)
        assert [s for s, _ in results] == [200] * 5
        assert all(b["usage"]["completion_tokens"] == 60 for _, b in results)
        assert eng.snapshot()["running"] == 0 and eng.core.used_blocks == 0
        queue_sum = metric_value(await metrics(client), "vllm:request_queue_time_seconds_sum")
        assert queue_sum > 0  # three requests waited for a slot


async def test_a_client_that_goes_away_frees_its_slot() -> None:
    app = create_app(EngineConfig(role="both", port=0, scale=ScaleSettings(time_scale=5)))
    async with serving(app) as url, aiohttp.ClientSession(url) as client:
        eng = app[ENGINE_KEY]
        resp = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 5000, "stream": True})
        assert resp.status == 200
        await resp.content.readline()
        resp.close()
        await await_for(lambda: eng.snapshot()["running"] == 0 and eng.core.used_blocks == 0, 10, "slot freed")
        assert metric_value(await metrics(client), "vllm:request_success_total", {"finished_reason": "abort"}) == 1


async def test_a_client_that_leaves_before_the_first_token_frees_its_slot() -> None:
    """A long prefill: the client hangs up while nothing has been written yet."""
    app = create_app(EngineConfig(role="both", port=0, scale=ScaleSettings(time_scale=1)))
    async with serving(app) as url:
        eng = app[ENGINE_KEY]
        async with aiohttp.ClientSession(url) as client:
            task = asyncio.create_task(post(client, "/v1/completions", {"prompt": "l" * 400_000, "max_tokens": 1}))
            await await_for(lambda: eng.snapshot()["running"] == 1, 10, "the prefill running")
            task.cancel()
        await await_for(lambda: eng.snapshot()["running"] == 0 and eng.core.used_blocks == 0, 10, "slot freed")
