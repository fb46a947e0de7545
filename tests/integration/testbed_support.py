"""Helpers for the testbed's integration tests: free ports, polling with deadlines, in-process apps on real
sockets, and subprocesses that are always killed in teardown."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from prfaas_local.ports import free_port as free_port  # one port picker for tests and stacks
from prfaas_local.procs import Processes as Processes  # one process group for tests and stacks
from prfaas_local.stack import LocalStack, StackSpec

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
    from prfaas_router.state.metrics import sample_sum

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


# -- the router tests' two-region stack: a thin fixture over the one builder (prfaas_local.stack) ---------------

TIME_SCALE = 200.0
"""Time-scaled so that long prompts take milliseconds."""
BYTE_SCALE = 1e-3
TOKEN = "s3cret-token"
GATEWAY_AUTH = {"Authorization": f"Bearer {TOKEN}"}
ALIASES = {"prf": "prfaas-0", "pdp": "pd-0", "pdd": "pd-1", "link_admin": "link-0"}
"""The tests' short names of the builder's processes."""


class Stack(LocalStack):
    """One PrFaaS engine (H200) behind the prefill gateway and its link relay, a PD prefill and a PD decode engine
    (H20) and the router, as real processes on 127.0.0.1 (:meth:`LocalStack.start`)."""

    def url(self, name: str) -> str:
        return super().url(ALIASES.get(name, name))

    @property
    def router(self) -> str:
        return self.url("router")

    @property
    def dir(self) -> Path:
        return self.work_dir

    def write_router_config(self, **changes: Any) -> None:
        self.write_config("router", {**self.configs["router"], **changes})


def model_profile_json() -> dict[str, Any]:
    from prfaas_core.capacity.profiles import builtin_model_profiles

    spec = builtin_model_profiles()["internal-1t"]
    return spec.model_dump(mode="json", by_alias=True, exclude_none=True)


def start_stack(
    procs: Processes,
    tmp: Path,
    threshold_min_tokens: int = 19_634,
    gateway_admission: dict[str, Any] | None = None,
    gateway_extra: dict[str, Any] | None = None,
    wait_ready: bool = True,
    link_gbps: float = 100.0,
    gateway_replicas: int = 1,
    gateway_tls: tuple[Path, Path] | None = None,
    router_args: Sequence[str] = (),
    router_cmd: Sequence[str] = (),
    **router_extra: Any,
) -> Stack:
    """``gateway_admission``: the gateway's ``gateway.admission`` block plus ``capacityGbps`` of its link (and
    ``siteEgressCapGbps``, the gateway's site cap);
    ``gateway_extra``: more top-level fields of the gateway's config; ``wait_ready=False``: return as soon as
    the processes are started; ``link_gbps``: the link emulator's capacity (and the routers' configured one);
    ``gateway_replicas`` > 1: the admission's ``replicas`` and ``peers`` name them all (``gateway``,
    ``gateway-2``, ...); ``gateway_tls``: (certificate, key) the gateways serve, which the router's remote and
    the replicas' peers verify; ``router_args``: more command-line arguments of the router (``--peers``);
    ``router_cmd``: how the router and the gateways are run (``prfaas`` from an image: test_image.py)."""
    admission = dict(gateway_admission) if gateway_admission is not None else None
    spec = StackSpec(
        n_prfaas=1,
        n_pd=2,
        initial_prefill=1,
        link_gbps=link_gbps,
        time_scale=TIME_SCALE,
        byte_scale=BYTE_SCALE,
        threshold_min_tokens=threshold_min_tokens,
        gateway_admission=admission is not None,
        gateway_link_gbps=admission.pop("capacityGbps") if admission is not None else None,
        site_egress_cap_gbps=admission.pop("siteEgressCapGbps", None) if admission is not None else None,
        admission=admission,
        gateway_token=TOKEN,
        gateway_replicas=gateway_replicas,
        gateway_tls=gateway_tls,
        routing={"refreshIntervalSeconds": 0.2, "breakerOpenSeconds": 2},
        remote_timeout_s=10,
        gateway_extra=gateway_extra or {},
        router_extra=router_extra,
        router_args=tuple(router_args),
        router_cmd=tuple(router_cmd),
    )
    stack = Stack(spec, tmp, procs=procs)
    stack.start(wait=wait_ready)
    return stack
