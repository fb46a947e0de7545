"""Runtime control of the engine emulator: drain, role flips and fault knobs (in-process, real sockets)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from testbed_support import await_for, metric_value, serving

from prfaas_core.launch.emulation import ScaleSettings
from prfaas_engine import ENGINE_KEY, EngineConfig, create_app
from prfaas_engine.engine import Engine
from prfaas_engine.timing import ServiceTimes

Client = tuple[aiohttp.ClientSession, Engine]
DECODE_LEG = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_engine_id": "e",
    "remote_block_ids": [0],
    "remote_host": "127.0.0.1",
    "remote_port": 9,
}


@pytest.fixture
async def engine() -> AsyncIterator[Client]:
    app = create_app(EngineConfig(role="both", port=0, scale=ScaleSettings(time_scale=50), seed=1))
    async with serving(app) as url, aiohttp.ClientSession(url) as client:
        yield client, app[ENGINE_KEY]


async def post(client: aiohttp.ClientSession, path: str, body: Any) -> tuple[int, Any]:
    async with client.post(path, json=body) as resp:
        return resp.status, await resp.json()


async def test_drain_refuses_new_work_finishes_old_and_reports_drained(engine: Client) -> None:
    client, eng = engine
    in_flight = asyncio.create_task(post(client, "/v1/completions", {"prompt": "p" * 40, "max_tokens": 200}))
    await await_for(lambda: eng.snapshot()["running"] == 1, 10, "a running request")
    status, state = await post(client, "/admin/drain", {})
    assert status == 200 and state["draining"] is True and state["drained"] is False
    async with client.get("/health") as resp:
        assert resp.status == 503
    status, refused = await post(client, "/v1/completions", {"prompt": "new", "max_tokens": 1})
    assert status == 503 and "draining" in refused["error"]["message"]
    status, done = await in_flight
    assert status == 200 and done["usage"]["completion_tokens"] == 200
    async with client.get("/admin/state") as resp:
        assert (await resp.json())["drained"] is True
    async with client.get("/metrics") as resp:
        assert metric_value(await resp.text(), "prfaas_engine_draining") == 1
    status, state = await post(client, "/admin/drain", {"drain": False})
    assert state["draining"] is False
    async with client.get("/health") as resp:
        assert resp.status == 200
    status, _ = await post(client, "/admin/drain", {"drain": "yes"})
    assert status == 400


async def test_role_flip_changes_which_legs_are_served(engine: Client) -> None:
    client, _ = engine
    status, state = await post(client, "/admin/role", {"role": "prefill"})
    assert status == 200 and state["role"] == "prefill"
    status, refused = await post(client, "/v1/completions", {"prompt": "x", "kv_transfer_params": DECODE_LEG})
    assert status == 400 and "role is prefill" in refused["error"]["message"]
    status, _ = await post(client, "/v1/completions", {"prompt": "x", "max_tokens": 2})
    assert status == 200  # plain requests are still served, as vLLM's kv_producer does
    status, state = await post(client, "/admin/role", {"role": "decode"})
    assert state["role"] == "decode"
    status, refused = await post(
        client, "/v1/completions", {"prompt": "x", "kv_transfer_params": {"do_remote_decode": True}}
    )
    assert status == 400 and "role is decode" in refused["error"]["message"]
    async with client.get("/metrics") as resp:
        text = await resp.text()
    assert metric_value(text, "prfaas_engine_info", {"role": "decode"}) == 1
    with pytest.raises(KeyError):
        metric_value(text, "prfaas_engine_info", {"role": "prefill"})
    status, refused = await post(client, "/admin/role", {"role": "router"})
    assert status == 400 and "prefill, decode, both" in refused["error"]["message"]


async def test_error_rate_fault_answers_500(engine: Client) -> None:
    client, _ = engine
    status, _ = await post(client, "/admin/faults", {"error_rate": 1})
    assert status == 200
    status, body = await post(client, "/v1/completions", {"prompt": "x"})
    assert status == 500 and "injected fault" in body["error"]["message"]
    await post(client, "/admin/faults", {"error_rate": 0.0})
    status, _ = await post(client, "/v1/completions", {"prompt": "x", "max_tokens": 1})
    assert status == 200


@pytest.mark.parametrize(
    ("body", "field"),
    [({"error_rate": 2}, "error_rate"), ({"slow_factor": 0.5}, "slow_factor"), ({"explode": True}, "explode")],
)
async def test_bad_fault_settings_are_400(engine: Client, body: dict[str, Any], field: str) -> None:
    client, _ = engine
    status, answer = await post(client, "/admin/faults", body)
    assert status == 400 and field in answer["error"]["message"]


async def test_drop_mid_stream_cuts_the_connection_after_the_first_token(engine: Client) -> None:
    client, eng = engine
    await post(client, "/admin/faults", {"drop_mid_stream": 1.0})
    body = {"prompt": "x", "max_tokens": 50, "stream": True}
    with pytest.raises(aiohttp.ClientPayloadError):
        async with client.post("/v1/completions", json=body) as resp:
            assert resp.status == 200
            await resp.read()
    await await_for(lambda: eng.core.used_blocks == 0 and not eng.core.running, 10, "the dropped request freed")


async def test_slow_factor_multiplies_step_times(engine: Client) -> None:
    client, eng = engine
    await post(client, "/admin/faults", {"slow_factor": 4.0})
    await post(client, "/v1/completions", {"prompt": "x" * 400, "max_tokens": 1})
    async with client.get("/metrics") as resp:
        ttft = metric_value(await resp.text(), "vllm:time_to_first_token_seconds_sum")
    assert ttft >= 4.0 * ServiceTimes(eng.config.hardware_profile).prefill_s(100)


async def test_die_stops_answering(engine: Client) -> None:
    client, eng = engine
    status, _ = await post(client, "/admin/faults", {"die": True})
    assert status == 200
    await await_for(lambda: eng.state.dead, 30, "the engine dead")
    with pytest.raises(aiohttp.ClientError):
        async with client.get("/health") as resp:
            await resp.read()
