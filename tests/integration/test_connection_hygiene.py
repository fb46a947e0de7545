"""Connection hygiene of the router's listener (``RouterConfig.security``), against a real ``prfaas router``
process: hundreds of silent, slow-header, slow-body and idle keep-alive connections are closed within their
timeouts while normal requests keep being answered, and a connection flood past ``maxConnections`` is cut."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from testbed_support import PRFAAS, Processes, free_port, metric_value, model_profile_json, processes, wait_for

SECURITY = {
    "headerTimeoutSeconds": 1,
    "bodyTimeoutSeconds": 1,
    "keepaliveIdleSeconds": 1,
    "maxConnections": 400,
    "maxConnectionsPerClient": 400,  # every connection here comes from 127.0.0.1 (test_hardening: the per-client one)
    "maxHeaderBytes": 2048,
}
BOUND_S = 60.0
"""Failure bound only: every attack connection must be closed by the server long before it (timeouts of 1 s)."""


@dataclass
class Router:
    procs: Processes
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def metric(self, name: str, **labels: str) -> float:
        try:
            return metric_value(httpx.get(self.url + "/metrics", timeout=5).text, name, labels)
        except KeyError:
            return 0.0


def start_router(procs: Processes, tmp: Path, **security: object) -> Router:
    engine = free_port()
    procs.start(
        "engine",
        [*PRFAAS, "engine", "--role", "both", "--hardware", "H20", "--port", str(engine),
         "--kv-listen", f"127.0.0.1:{free_port()}", "--time-scale", "200", "--byte-scale", "0.001"],
    )  # fmt: skip
    config = {
        "pdCluster": "pd",
        "thresholdMinTokens": 1_000_000,
        "model": model_profile_json(),
        "endpoints": [{"name": "pd-0", "url": f"http://127.0.0.1:{engine}", "role": "both"}],
        "scale": {"timeScale": 200.0, "byteScale": 1e-3},
        "security": {**SECURITY, **security},
    }
    (tmp / "router.json").write_text(json.dumps(config))
    r = Router(procs, free_port())
    procs.start("router", [*PRFAAS, "router", "--config", str(tmp / "router.json"), "--port", str(r.port)])

    def ready() -> bool:
        procs.check_alive()
        return httpx.get(r.url + "/ready", timeout=2).status_code == 200

    wait_for(ready, 60, "the router to be ready")
    return r


@pytest.fixture
def router(tmp_path: Path) -> Iterator[Router]:
    with processes(tmp_path) as procs:
        yield start_router(procs, tmp_path)


async def _until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sent until it closed the connection."""
    got = b""
    try:
        while chunk := await reader.read(65536):
            got += chunk
    except ConnectionError:
        pass
    return got


async def _silent(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return await _until_closed(reader)
    finally:
        writer.close()


async def _slow_headers(port: int, keepalive_first: bool = False) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if keepalive_first:  # one good request, then the next one's headers trickle in
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            await reader.readuntil(b'"ok"}')
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        closed = asyncio.ensure_future(_until_closed(reader))
        while not closed.done():
            try:
                writer.write(b"X")  # one byte of a header name at a time, never the end of the headers
                await writer.drain()
            except ConnectionError:
                break
            await asyncio.wait([closed], timeout=0.2)
        return await closed
    finally:
        writer.close()


async def _slow_body(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 10000\r\n\r\n{"model": '
        )
        await writer.drain()
        return await _until_closed(reader)
    finally:
        writer.close()


async def _idle_keepalive(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        return await _until_closed(reader)
    finally:
        writer.close()


async def _normal_requests(url: str, stop: asyncio.Event) -> list[int]:
    statuses = []
    body = {"model": "m", "prompt": "hello " * 20, "max_tokens": 2}
    # a well-behaved client drops an idle pooled connection before the server's idle timeout does: reusing one the
    # server is closing at that moment is HTTP/1.1's keep-alive race (a ReadError on a loaded machine), not the
    # router's fault; keep-alive reuse within the timeout is still exercised
    limits = httpx.Limits(keepalive_expiry=SECURITY["keepaliveIdleSeconds"] / 2)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        while not stop.is_set():
            statuses.append((await client.post(url + "/v1/completions", json=body)).status_code)
            statuses.append((await client.get(url + "/health")).status_code)
            await asyncio.sleep(0.05)
    return statuses


def test_slowloris_connections_are_closed_in_time_while_normal_requests_are_served(router: Router) -> None:
    async def attack() -> tuple[list[bytes], ...]:
        stop = asyncio.Event()
        normal = asyncio.ensure_future(_normal_requests(router.url, stop))
        p = router.port
        groups = await asyncio.wait_for(
            asyncio.gather(
                asyncio.gather(*(_silent(p) for _ in range(200))),
                asyncio.gather(*(_slow_headers(p) for _ in range(40))),
                asyncio.gather(*(_slow_headers(p, keepalive_first=True) for _ in range(20))),
                asyncio.gather(*(_slow_body(p) for _ in range(40))),
                asyncio.gather(*(_idle_keepalive(p) for _ in range(40))),
            ),
            BOUND_S,
        )
        stop.set()
        return (*groups, await normal)

    silent, slow_headers, slow_second, slow_body, idle, normal = asyncio.run(attack())
    assert all(got == b"" for got in silent)  # closed without a word
    assert all(b"HTTP/1.1 200" not in got for got in slow_headers)
    assert all(b"HTTP/1.1 200" not in got for got in slow_second)  # the first request's answer came before
    assert all(got.startswith(b"HTTP/1.1 408") for got in slow_body)
    assert all(got.startswith(b"HTTP/1.1 200") for got in idle)
    assert normal and set(normal) == {200}
    assert router.metric("prfaas_router_connections_closed_total", reason="header_timeout") >= 240
    assert router.metric("prfaas_router_connections_closed_total", reason="body_timeout") >= 40
    wait_for(lambda: router.metric("prfaas_router_open_connections") <= 1, 30, "the connections to be gone")


def test_oversized_headers_are_refused(router: Router) -> None:
    resp = httpx.get(router.url + "/health", headers={"x-big": "a" * 4096}, timeout=5)
    assert resp.status_code in (400, 431)
    assert httpx.get(router.url + "/health", timeout=5).status_code == 200


def test_header_limits_follow_a_live_config_reload(tmp_path: Path) -> None:
    """aiohttp's limits (header size here) are fixed per connection when it is made: after a reload that
    lowers ``maxHeaderBytes``, new connections refuse a header the old limit accepted (and the reverse)."""
    with processes(tmp_path) as procs:
        r = start_router(procs, tmp_path)
        header = {"x-mid": "a" * 1500}
        assert httpx.get(r.url + "/health", headers=header, timeout=5).status_code == 200
        config = json.loads((tmp_path / "router.json").read_text())

        def reload(**security: object) -> None:
            config["security"] = {**config["security"], **security}
            (tmp_path / "router.json.tmp").write_text(json.dumps(config))
            (tmp_path / "router.json.tmp").replace(tmp_path / "router.json")

        reload(maxHeaderBytes=1024)
        wait_for(lambda: httpx.get(r.url + "/health", headers=header, timeout=5).status_code in (400, 431), 30,
                 "the lower header limit to apply to new connections")  # fmt: skip
        assert httpx.get(r.url + "/health", timeout=5).status_code == 200
        reload(maxHeaderBytes=4096)
        big = {"x-big": "a" * 3000}
        wait_for(lambda: httpx.get(r.url + "/health", headers=big, timeout=5).status_code == 200, 30,
                 "the higher header limit to apply to new connections")  # fmt: skip


def test_connections_past_the_cap_are_closed_at_once_and_service_resumes(tmp_path: Path) -> None:
    with processes(tmp_path) as procs:
        r = start_router(procs, tmp_path, maxConnections=50, maxConnectionsPerClient=50, headerTimeoutSeconds=30)

        async def flood() -> list[bytes]:
            opened = [await asyncio.open_connection("127.0.0.1", r.port) for _ in range(50)]
            extra = [await asyncio.open_connection("127.0.0.1", r.port) for _ in range(20)]
            try:
                return await asyncio.wait_for(asyncio.gather(*(_until_closed(rd) for rd, _ in extra)), BOUND_S)
            finally:
                for _, w in opened + extra:
                    w.close()

        assert asyncio.run(flood()) == [b""] * 20
        wait_for(lambda: r.metric("prfaas_router_open_connections") <= 1, 30, "the flood to be gone")
        assert r.metric("prfaas_router_connections_closed_total", reason="limit") >= 20
        assert httpx.get(r.url + "/health", timeout=5).status_code == 200
