"""The testbed's own ceiling on this machine: one engine emulator's sustained request rate and the link
emulator's maximum throughput, each beside a baseline, so later benchmarks know where the testbed — not the
system under test — becomes the limit.

* engine: ``prfaas engine`` (a real process) at a huge time scale (service time ~0) with tiny requests
  (prompt "hi", 1 token), driven by N concurrent connections (wrk when installed, else aiohttp); baseline:
  a bare aiohttp server answering the same JSON without any engine logic.
* relay: bytes from a TCP source through ``prfaas link`` with an unreachable capacity; baseline: the same
  source read directly. Also the shaped case: the achieved rate over the configured rate (at most 1 by
  construction; the lower bound the integration tests assert).

Usage: ``python benchmarks/testbed.py [--seconds 5] [--concurrency 32] [--megabytes 256] [--smoke]``. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Callable

import aiohttp

from prfaas_local.ports import free_port
from prfaas_local.procs import spawn_process, stop_processes

PRFAAS = [sys.executable, "-m", "prfaas_cli.main"]
SOURCE = textwrap.dedent(
    """
    import asyncio, sys
    BLOCK = bytes(1 << 20)
    async def handle(reader, writer):
        n = int((await reader.readline()).decode())
        while n > 0:
            writer.write(BLOCK[: min(n, len(BLOCK))]); n -= min(n, len(BLOCK)); await writer.drain()
        writer.close()
    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
        async with server: await server.serve_forever()
    asyncio.run(main())
    """
)
BASELINE_SERVER = textwrap.dedent(
    """
    import sys
    from aiohttp import web
    BODY = {"id": "cmpl-x", "object": "text_completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "text": " the", "finish_reason": "length", "logprobs": None}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    async def complete(request):
        await request.json()
        return web.json_response(BODY)
    async def health(request):
        return web.Response()
    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
    """
)


def _wait(ready: Callable[[], bool], proc: subprocess.Popen[bytes], what: str, deadline_s: float = 300.0) -> None:
    """Until ``ready()`` or the process exits (its start is what is waited on; the deadline only bounds a hang)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if ready():
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with {proc.returncode} before it was ready")
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not come up in {deadline_s:g} s")


def wait_http(url: str, proc: subprocess.Popen[bytes]) -> None:
    def ready() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    _wait(ready, proc, url)


def wait_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    def ready() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    _wait(ready, proc, f"port {port}")


async def load(url: str, seconds: float, concurrency: int) -> tuple[float, float]:
    """Closed-loop load: (requests per second, median latency in ms)."""
    body = {"model": "m", "prompt": "hi", "max_tokens": 1}
    latencies: list[float] = []
    errors = 0
    end = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(url, connector=connector) as client:

        async def worker() -> None:
            nonlocal errors
            while time.perf_counter() < end:
                t = time.perf_counter()
                async with client.post("/v1/completions", json=body) as resp:
                    await resp.read()
                    if resp.status != 200:
                        errors += 1
                latencies.append(time.perf_counter() - t)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{errors} requests failed")
    latencies.sort()
    return len(latencies) / elapsed, latencies[len(latencies) // 2] * 1000


async def pull(port: int, nbytes: int) -> float:
    """Seconds to receive nbytes from a source listening on (or relayed to) port."""
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{nbytes}\n".encode())
    await writer.drain()
    got = 0
    while chunk := await reader.read(1 << 20):
        got += len(chunk)
    writer.close()
    if got != nbytes:
        raise RuntimeError(f"received {got} of {nbytes} bytes")
    return time.perf_counter() - start


WRK_SCRIPT = """wrk.method = "POST"
wrk.body = '{"model": "m", "prompt": "hi", "max_tokens": 1}'
wrk.headers["Content-Type"] = "application/json"
"""


def wrk_load(url: str, seconds: float, concurrency: int) -> tuple[float, float]:
    """(requests per second, median latency in ms) measured by wrk (Debian package), a C load generator."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(WRK_SCRIPT)
    try:
        argv = ["wrk", "-t2", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--latency", "-s", f.name]
        out = subprocess.run([*argv, f"{url}/v1/completions"], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    if "Non-2xx" in out:
        raise RuntimeError(f"wrk saw errors:\n{out}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    value, unit = re.search(r"50%\s+([\d.]+)(us|ms|s)", out).groups()  # type: ignore[union-attr]
    return rps, float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def bench_engine(seconds: float, concurrency: int) -> dict[str, float]:
    out: dict[str, float] = {"load_generator_wrk": float(shutil.which("wrk") is not None)}
    for name, argv_of in (
        ("baseline", lambda port: [sys.executable, "-c", BASELINE_SERVER, str(port)]),
        (
            "engine",
            lambda port: [
                *PRFAAS, "engine", "--role", "both", "--port", str(port), "--time-scale", "1e6",
                "--max-batch", "1024", "--max-waiting", "100000",
            ],
        ),
    ):  # fmt: skip
        port = free_port()
        proc = spawn_process(argv_of(port))
        try:
            wait_http(f"http://127.0.0.1:{port}/health", proc)
            asyncio.run(load(f"http://127.0.0.1:{port}", 1.0, concurrency))  # warm-up
            if shutil.which("wrk"):
                rps, p50 = wrk_load(f"http://127.0.0.1:{port}", seconds, concurrency)
            else:
                rps, p50 = asyncio.run(load(f"http://127.0.0.1:{port}", seconds, concurrency))
        finally:
            stop_processes([proc])
        out[f"{name}_rps"], out[f"{name}_p50_ms"] = rps, p50
    return out


def bench_relay(megabytes: int, shaped_megabytes: int = 200) -> dict[str, float]:
    nbytes = megabytes * 1_000_000
    src_port, link_port, shaped_port = free_port(), free_port(), free_port()
    procs = [spawn_process([sys.executable, "-c", SOURCE, str(src_port)])]
    common = ["--time-scale", "1", "--byte-scale", "1", "--rtt-ms", "0", "--target", f"127.0.0.1:{src_port}"]
    procs.append(
        spawn_process([*PRFAAS, "link", "--listen", f"127.0.0.1:{link_port}", "--capacity-gbps", "1e6", *common])
    )
    shaped_gbps = 0.8  # 100 MB/s on the wire
    procs.append(
        spawn_process(
            [*PRFAAS, "link", "--listen", f"127.0.0.1:{shaped_port}", "--capacity-gbps", str(shaped_gbps), *common]
        )
    )
    try:
        for port, proc in zip((src_port, link_port, shaped_port), procs, strict=True):
            wait_port(port, proc)
        asyncio.run(pull(src_port, 10_000_000))
        direct = asyncio.run(pull(src_port, nbytes))
        asyncio.run(pull(link_port, 10_000_000))
        relayed = asyncio.run(pull(link_port, nbytes))
        shaped_bytes = shaped_megabytes * 1_000_000
        shaped = asyncio.run(pull(shaped_port, shaped_bytes))
    finally:
        stop_processes(procs)
    configured = shaped_gbps * 1e9 / 8
    return {
        "direct_MBps": nbytes / direct / 1e6,
        "relay_MBps": nbytes / relayed / 1e6,
        "shaped_configured_MBps": configured / 1e6,
        "shaped_MBps": shaped_bytes / shaped / 1e6,
        "shaped_ratio": shaped_bytes / shaped / configured,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="load duration per server")
    parser.add_argument("--concurrency", type=int, default=32, help="concurrent clients")
    parser.add_argument("--megabytes", type=int, default=256, help="bytes per relay transfer, MB")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument(
        "--smoke", action="store_true", help="the real code path on a tiny input (1-s loads, 8 MB and 10 MB shaped)"
    )
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.megabytes = 1.0, 8
    engine = bench_engine(args.seconds, args.concurrency)
    relay = bench_relay(args.megabytes, 10 if args.smoke else 200)
    if args.json:
        print(json.dumps({"cpus": os.cpu_count(), **engine, **relay}))
        return
    generator = "wrk" if engine["load_generator_wrk"] else "aiohttp (install wrk for a truer ceiling)"
    print(f"testbed ceiling on this machine ({os.cpu_count()} CPUs; client and servers share them; load: {generator})")
    print(f"{'':34}{'testbed':>12}{'baseline':>12}{'ratio':>8}")
    print(
        f"{'engine, tiny requests (req/s)':34}{engine['engine_rps']:12.0f}{engine['baseline_rps']:12.0f}"
        f"{engine['engine_rps'] / engine['baseline_rps']:8.2f}"
    )
    print(f"{'  median latency (ms)':34}{engine['engine_p50_ms']:12.2f}{engine['baseline_p50_ms']:12.2f}")
    print(
        f"{'relay, unshaped (MB/s)':34}{relay['relay_MBps']:12.0f}{relay['direct_MBps']:12.0f}"
        f"{relay['relay_MBps'] / relay['direct_MBps']:8.2f}"
    )
    print(
        f"{'relay, shaped to 100 MB/s (MB/s)':34}{relay['shaped_MBps']:12.1f}{relay['shaped_configured_MBps']:12.1f}"
        f"{relay['shaped_ratio']:8.3f}"
    )
    print("baselines: a bare aiohttp server with the same JSON answer; a direct TCP read from the same source;")
    print("the shaped row's baseline is the configured rate (achieved/configured <= 1 by construction).")


if __name__ == "__main__":
    main()
