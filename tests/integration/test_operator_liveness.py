"""The operator's liveness means something (issue 46): ``/healthz`` answers 503 with the reason when the
reconcile loop stops making progress (a tick that never returns, an event loop blocked by synchronous code) or
one of its tasks ended, and 200 again once it goes round; ``/readyz`` once the loop has gone round. The real
operator object graph against the Kubernetes API emulator (its Lease held for real), probed over HTTP."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from prfaas_local.ports import free_port
from prfaas_operator.config import OperatorConfig
from prfaas_operator.kube import KubeCredentials
from prfaas_operator.runner import build
from prfaas_testbed.k8s_emulator import EmulatorThread

STALL_S = 1.5


def probe(url: str) -> tuple[int, str]:
    resp = httpx.get(url, timeout=5)
    return resp.status_code, resp.text


async def until(check: Callable[[], tuple[int, str]], status: int, what: str, timeout_s: float = 30) -> str:
    """Poll the probe (from a thread: the event loop may be what is being tested) until it answers ``status``."""
    deadline = time.monotonic() + timeout_s
    last: tuple[int, str] = (0, "")
    while time.monotonic() < deadline:
        last = await asyncio.to_thread(check)
        if last[0] == status:
            return last[1]
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last answer {last}")


def test_healthz_fails_when_the_reconcile_loop_is_wedged(tmp_path: Path) -> None:
    emu = EmulatorThread().start()
    port = free_port()
    config = OperatorConfig(
        namespaces=("default",),
        metrics_port=port,
        metrics_host="127.0.0.1",
        tick_s=0.2,
        liveness_stall_s=STALL_S,
        lease_duration_s=4,
        lease_renew_s=1,
        prometheus_url="http://127.0.0.1:9",
    )
    creds = KubeCredentials.load(str(emu.write_kubeconfig(tmp_path / "kubeconfig")))
    healthz, readyz = f"http://127.0.0.1:{port}/healthz", f"http://127.0.0.1:{port}/readyz"

    async def scenario() -> None:
        op = build(config, creds)
        await op.start()
        try:
            await until(lambda: probe(readyz), 200, "ready")
            # (waited on, not read once: on a loaded machine the loop may be slower than STALL_S between two ticks)
            assert (await until(lambda: probe(healthz), 200, "live")).startswith("ok: ")
            assert "prfaas_operator_leader" in httpx.get(f"http://127.0.0.1:{port}/metrics").text
            deadline = time.monotonic() + 30
            while not op.leader.is_leader and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert op.leader.is_leader

            # 1. a tick that never returns (an await that never resolves): no progress, not live, not ready
            release = asyncio.Event()
            tick = op.cycle.tick

            async def stuck(now_s: float) -> None:
                await release.wait()

            op.cycle.tick = stuck  # type: ignore[method-assign]
            op.cycle.wake.set()
            why = await until(lambda: probe(healthz), 503, "liveness to fail on a stuck tick")
            assert "made no progress" in why, why
            assert probe(readyz)[0] == 503
            op.cycle.tick = tick  # type: ignore[method-assign]
            release.set()
            await until(lambda: probe(healthz), 200, "liveness back once the loop goes round")

            # 2. the event loop blocked by synchronous code: the probe (its own thread) still answers, 503
            seen: list[str] = []

            def watch() -> None:
                end = time.monotonic() + 30
                while time.monotonic() < end and not seen:
                    status, text = probe(healthz)
                    if status == 503:
                        seen.append(text)
                    time.sleep(0.1)

            watcher = threading.Thread(target=watch)
            watcher.start()
            end = time.monotonic() + 30
            while not seen and time.monotonic() < end:  # the wedge itself: blocks the loop until 503 is seen
                time.sleep(0.05)
            watcher.join()
            assert seen and "made no progress" in seen[0], seen
            await until(lambda: probe(healthz), 200, "liveness back once the loop runs again")

            # 3. a task of the operator ended
            resync = next(t for t in op.tasks if t.get_name() == "prfaas-resync")
            resync.cancel()
            why = await until(lambda: probe(healthz), 503, "liveness to fail when a task ended")
            assert "task prfaas-resync has ended" in why, why
        finally:
            await op.shutdown()

    try:
        asyncio.run(scenario())
    finally:
        emu.stop()
