"""Helpers for the testbed's integration tests: free ports, polling with deadlines, in-process apps on real
sockets, and subprocesses that are always killed in teardown."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from prfaas_local.ports import free_port as free_port  # one port picker for tests and stacks

T = TypeVar("T")
PRFAAS = [sys.executable, "-m", "prfaas_cli.main"]
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_PROXY": "*", "no_proxy": "*"}


def wait_for(check: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.05) -> T:
    """Poll ``check`` until it returns a truthy value; fail with ``what`` after the deadline."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # not ready yet
            last_error = exc
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last error: {last_error!r})")


async def await_for(check: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.02) -> Any:
    """Async :func:`wait_for`; ``check`` may be a coroutine function."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
        except Exception as exc:
            last_error = exc
        await asyncio.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last error: {last_error!r})")


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """Run an aiohttp app on 127.0.0.1 (any free port); yields its base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def http(
    method: str,
    url: str,
    body: Any = None,
    timeout_s: float = 10.0,
    headers: dict[str, str] | None = None,
    ca_file: Path | None = None,
) -> tuple[int, Any]:
    """A blocking JSON request (for tests of subprocesses); returns (status, parsed body or text). ``ca_file``
    verifies an https server."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})}
    )
    context = ssl.create_default_context(cafile=str(ca_file)) if ca_file is not None else None
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=context) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def metric_value(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The sum of the samples of ``name`` (matching ``labels``) in Prometheus text (the router's one reader)."""
    from prfaas_router.prom_text import sample_sum

    total = sample_sum(text, name, labels)
    if total is None:
        raise KeyError(f"no sample {name} {labels or ''}")
    return total


def prompt(tokens: int) -> str:
    """A prompt of ``tokens`` tokens (chars4 tokenizer) sharing no prefix block with any other."""
    head = uuid.uuid4().hex  # 32 chars = 8 tokens, unique
    return head + "x" * (tokens * 4 - len(head))


def counter(url: str, name: str, headers: dict[str, str] | None = None, **labels: str) -> float:
    """``metric_value`` of the server at ``url`` (its /metrics; ``headers``: a gateway's token); 0 when it exports
    no such sample yet."""
    import httpx

    try:
        return metric_value(httpx.get(url + "/metrics", timeout=5, headers=headers).text, name, labels)
    except KeyError:
        return 0.0


class Processes:
    """Subprocesses of one test, logs in files; every one is terminated (then killed) in teardown."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 - the child keeps its own descriptor
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})}
        )
        log.close()
        self.procs.append((name, proc))
        return proc

    def log(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def check_alive(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.log(name)[-3000:]}")

    def stop_all(self) -> None:
        for _, proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


@contextlib.contextmanager
def processes(log_dir: Path) -> Iterator[Processes]:
    group = Processes(log_dir)
    try:
        yield group
    finally:
        group.stop_all()


def sse_payloads(text: str) -> list[Any]:
    """The ``data:`` payloads of an SSE body, JSON-decoded (``[DONE]`` kept as the string)."""
    out: list[Any] = []
    for line in text.splitlines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out
