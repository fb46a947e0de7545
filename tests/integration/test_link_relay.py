"""The link emulator on real sockets (in-process): exact bytes, capacity as a lower bound on time, fair
sharing, RTT, loss, live reconfiguration, faults and the admin/metrics API."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from testbed_support import metric_value, serving

from prfaas_core.launch.emulation import ScaleSettings
from prfaas_link import Endpoint, Link, LinkConfig
from prfaas_link.admin import create_admin_app
from prfaas_link.relay import PACER_LOOKAHEAD_S

ONE_TO_ONE = ScaleSettings(time_scale=1.0, byte_scale=1.0)


@dataclass
class Source:
    """A TCP server that answers a line ``<n>`` with exactly n bytes (the prefill side's role)."""

    port: int
    server: asyncio.Server


@pytest.fixture
async def source() -> AsyncIterator[Source]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = int((await reader.readline()).decode())
        block = bytes(65536)
        while n > 0:
            writer.write(block[: min(n, len(block))])
            n -= min(n, len(block))
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    yield Source(int(server.sockets[0].getsockname()[1]), server)
    server.close()
    await server.wait_closed()


@pytest.fixture
async def link(source: Source, request: pytest.FixtureRequest) -> AsyncIterator[Link]:
    kwargs = {"capacity_gbps": 0.4, "rtt_ms": 2.0, "scale": ONE_TO_ONE, "name": "a-to-b", "seed": 3}
    kwargs.update(getattr(request, "param", {}))
    lk = Link(LinkConfig(listen=Endpoint("127.0.0.1", 0), target=Endpoint("127.0.0.1", source.port), **kwargs))
    await lk.start()
    yield lk
    await lk.close()


async def fetch(link: Link, nbytes: int) -> tuple[int, float]:
    """Ask the source for nbytes through the link; returns (bytes received, seconds)."""
    assert link.listen is not None
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection(link.listen.host, link.listen.port)
    got = 0
    try:
        writer.write(f"{nbytes}\n".encode())
        await writer.drain()
        while chunk := await reader.read(1 << 20):
            got += len(chunk)
    except ConnectionError:  # a fault cut the connection: report what arrived
        pass
    writer.close()
    return got, time.perf_counter() - start


async def test_a_transfer_moves_exact_bytes_no_faster_than_capacity(link: Link) -> None:
    n = 3_000_000
    rate = link.wire_rate()
    assert rate == pytest.approx(0.4e9 / 8)
    got, elapsed = await fetch(link, n)
    assert got == n
    assert elapsed >= n / rate + link.one_way_s()
    text = link.metrics.render().decode()
    assert metric_value(text, "prfaas_link_wire_bytes_total", {"link": "a-to-b"}) == n
    assert metric_value(text, "prfaas_link_egress_bytes_total", {"link": "a-to-b"}) == n
    assert metric_value(text, "prfaas_link_reverse_bytes_total", {"link": "a-to-b"}) == len(f"{n}\n")
    assert metric_value(text, "prfaas_link_capacity_gbps", {"link": "a-to-b"}) == pytest.approx(0.4)
    assert metric_value(text, "prfaas_link_utilization_ratio", {"link": "a-to-b"}) > 0


async def test_concurrent_transfers_share_the_capacity(link: Link) -> None:
    n = 3_000_000
    rate = link.wire_rate()
    start = time.perf_counter()

    async def timed() -> tuple[int, float]:
        got, _ = await fetch(link, n)
        return got, time.perf_counter() - start

    results = await asyncio.gather(*(timed() for _ in range(3)))
    assert [got for got, _ in results] == [n] * 3
    assert max(t for _, t in results) >= 3 * n / rate  # one capacity for all three
    # fair sharing: even the first to finish waited for most of the others' bytes (first-come-first-served
    # would finish it after n/rate)
    assert min(t for _, t in results) >= 2 * n / rate


@pytest.mark.parametrize("link", [{"capacity_gbps": 1000.0, "rtt_ms": 60.0}], indirect=True)
async def test_a_request_response_takes_at_least_one_rtt(link: Link) -> None:
    got, elapsed = await fetch(link, 10)
    assert got == 10 and elapsed >= 0.060


@pytest.mark.parametrize("link", [{"loss": 0.3, "rtt_ms": 1.0}], indirect=True)
async def test_loss_costs_capacity_but_never_corrupts(link: Link) -> None:
    n = 2_000_000
    got, elapsed = await fetch(link, n)
    assert got == n and elapsed >= n / link.wire_rate()


async def test_live_reconfiguration_cuts_then_restores_the_link(link: Link) -> None:
    link.reshape({"capacity_gbps": 0.0})
    transfer = asyncio.create_task(fetch(link, 200_000))
    done, _ = await asyncio.wait({transfer}, timeout=0.3)
    assert not done  # cut: nothing gets through
    assert link.snapshot()["active_transfers"] == 1
    link.reshape({"capacity_gbps": 2.0})
    got, _ = await transfer
    assert got == 200_000
    with pytest.raises(ValueError, match="capacity_gbps"):
        link.reshape({"capacity_gbps": -1})


async def test_faults_refuse_and_drop_connections(link: Link) -> None:
    link.set_faults({"error_rate": 1.0})
    got, _ = await fetch(link, 1000)
    assert got == 0
    link.set_faults({"error_rate": 0.0, "drop_mid_stream": 1.0})
    got, _ = await fetch(link, 1_000_000)
    assert 0 < got < 1_000_000
    text = link.metrics.render().decode()
    assert metric_value(text, "prfaas_link_dropped_connections_total", {"reason": "refused"}) == 1
    assert metric_value(text, "prfaas_link_dropped_connections_total", {"reason": "dropped"}) == 1


async def test_slow_factor_divides_the_capacity(link: Link) -> None:
    base = link.wire_rate()
    link.set_faults({"slow_factor": 4.0})
    assert link.wire_rate() == pytest.approx(base / 4)
    got, elapsed = await fetch(link, 500_000)
    assert got == 500_000 and elapsed >= 500_000 / (base / 4)


async def test_admin_api_reconfigures_and_exports_metrics(link: Link) -> None:
    async with serving(create_admin_app(link)) as url, aiohttp.ClientSession(url) as client:
        async with client.post("/admin/link", json={"capacity_gbps": 25.0, "rtt_ms": 40.0}) as resp:
            state = await resp.json()
            assert resp.status == 200 and state["capacity_gbps"] == 25.0 and state["rtt_ms"] == 40.0
        async with client.post("/admin/link", json={"loss": 1.5}) as resp:
            assert resp.status == 400 and "loss" in (await resp.json())["error"]["message"]
        async with client.post("/admin/faults", json={"bogus": 1}) as resp:
            assert resp.status == 400 and "bogus" in (await resp.json())["error"]["message"]
        async with client.post("/admin/link", data=b"nope") as resp:
            assert resp.status == 400
        async with client.get("/metrics") as resp:
            text = await resp.text()
        assert metric_value(text, "prfaas_link_capacity_gbps", {"link": "a-to-b"}) == 25.0
        assert metric_value(text, "prfaas_link_rtt_seconds", {"link": "a-to-b"}) == pytest.approx(0.04)
        async with client.get("/health") as resp:
            assert resp.status == 200


async def test_scaled_link_keeps_model_time() -> None:
    """Same model transfer at two scales: the wall time shrinks by time_scale, model bytes are reported."""
    scale = ScaleSettings(time_scale=10.0, byte_scale=1e-3)
    config = LinkConfig(
        listen=Endpoint("127.0.0.1", 0), target=Endpoint("127.0.0.1", 1), capacity_gbps=8.0, scale=scale
    )
    lk = Link(config)
    assert lk.wire_rate() == pytest.approx(8e9 / 8 * 1e-3 * 10)
    assert lk.one_way_s() == pytest.approx(0.001 / 10 / 2)


async def test_the_relays_own_1s_windows_hold_the_capacity_and_sum_to_the_counter(link: Link) -> None:
    """``GET /admin/egress``: the relay's own 1-s (model) windows of delivered bytes, keyed by the monotonic
    clock: they add up to the egress counter, and no window carries more than the capacity allows plus one
    chunk (the shaper grants a chunk at a time)."""
    n = 120_000_000  # 2.4 s at 0.4 Gbps: three or four windows
    got, _ = await fetch(link, n)
    assert got == n
    async with serving(create_admin_app(link)) as url, aiohttp.ClientSession(url) as client:
        async with client.get("/admin/egress", params={"since": "0"}) as resp:
            windows = {int(k): v for k, v in (await resp.json())["windows"].items()}
        async with client.get("/admin/egress", params={"since": "x"}) as resp:
            assert resp.status == 400 and "since" in (await resp.json())["error"]["message"]
    assert sum(windows.values()) == n and len(windows) >= 3
    assert max(windows.values()) <= link.wire_rate() * (1.0 + PACER_LOOKAHEAD_S) + link.config.chunk_bytes
    now = int(time.monotonic())
    assert all(now - 10 <= k <= now for k in windows)
