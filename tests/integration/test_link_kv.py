"""A KV transfer between emulated engines across the link emulator: the prefill engine advertises the
link's address, the decode engine pulls through it, and exactly the expected bytes cross, no faster than
the link's capacity allows."""

from __future__ import annotations

import time

import aiohttp
from testbed_support import free_port, metric_value, serving

from prfaas_core.launch.emulation import ScaleSettings
from prfaas_engine import ENGINE_KEY, EngineConfig, HostPort, create_app
from prfaas_link import Endpoint, Link, LinkConfig

SCALE = ScaleSettings(time_scale=10.0, byte_scale=1e-3)
PREFILL_LEG = {"do_remote_decode": True, "do_remote_prefill": False}


async def test_kv_crosses_the_link_exactly_and_no_faster_than_capacity() -> None:
    kv_port, link_port = free_port(), free_port()
    prefill_cfg = EngineConfig(
        role="prefill",
        port=0,
        scale=SCALE,
        kv_listen=HostPort("127.0.0.1", kv_port),
        kv_advertise=HostPort("127.0.0.1", link_port),
    )
    link = Link(
        LinkConfig(
            listen=Endpoint("127.0.0.1", link_port),
            target=Endpoint("127.0.0.1", kv_port),
            capacity_gbps=10.0,
            rtt_ms=5.0,
            scale=SCALE,
            name="h200-to-h20",
        )
    )
    await link.start()
    papp, dapp = create_app(prefill_cfg), create_app(EngineConfig(role="decode", port=0, scale=SCALE))
    try:
        async with (
            serving(papp) as purl,
            serving(dapp) as durl,
            aiohttp.ClientSession(purl) as p,
            aiohttp.ClientSession(durl) as d,
        ):
            prompt_tokens = 32 * 1024
            prompt = "k" * (4 * prompt_tokens)
            body = {"prompt": prompt, "max_tokens": 1, "kv_transfer_params": PREFILL_LEG}
            async with p.post("/v1/completions", json=body) as resp:
                kv = (await resp.json())["kv_transfer_params"]
            assert (kv["remote_host"], kv["remote_port"]) == ("127.0.0.1", link_port)

            model_bytes = papp[ENGINE_KEY].config.kv_model.kv_bytes(prompt_tokens)  # S_kv(32K) = 701.3 MiB
            wire = SCALE.wire_bytes(model_bytes)
            header = len(f"OK {wire}\n")
            start = time.perf_counter()
            async with d.post(
                "/v1/completions", json={"prompt": prompt, "max_tokens": 2, "kv_transfer_params": kv}
            ) as r:
                assert r.status == 200, await r.text()
            elapsed = time.perf_counter() - start

            text = link.metrics.render().decode()
            assert metric_value(text, "prfaas_link_wire_bytes_total", {"link": "h200-to-h20"}) == wire + header
            assert elapsed >= wire / link.wire_rate()
            # in model terms: the transfer took at least S_kv·8/capacity model seconds
            assert SCALE.model_seconds(elapsed) >= model_bytes * 8 / 10e9
            async with d.get("/metrics") as resp:
                received = metric_value(await resp.text(), "prfaas_engine_kv_bytes_received_total")
            assert received == SCALE.model_bytes(wire)
    finally:
        await link.close()
