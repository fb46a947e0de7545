"""Chaos on the emulated two-datacenter stack (tests/integration/router_stack.py): one fault at a time while
traffic flows, a ledger of every request (ledger.py), and the recovery after the fault heals.

The default run takes the short subset (marker ``chaos``): the gateway killed and restarted, a PD prefill engine
failing half its requests, the only decode engine killed and restarted. ``--full`` adds ``chaos and slow``:
the link squeezed to 5 % of its capacity and cut, a PrFaaS engine frozen. Each case asserts every request got
an answer (success, fallback, retry, or a clean documented error) and that the system recovers; the measured
table goes to ``$PRFAAS_CHAOS_TABLE`` when set.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from ledger import Ledger
from router_stack import Stack, start_stack
from testbed_support import counter, http, processes, wait_for

pytestmark = pytest.mark.chaos


def proc(stack: Stack, name: str) -> subprocess.Popen[bytes]:
    return [p for n, p in stack.procs.procs if n == name][-1]


def restart(stack: Stack, name: str) -> None:
    old = proc(stack, name)
    stack.procs.start(name, [str(a) for a in old.args])  # type: ignore[union-attr]


def record(fault: str, **row: object) -> None:
    path = os.environ.get("PRFAAS_CHAOS_TABLE")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"fault": fault, **row}) + "\n")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("chaos")
    with processes(tmp) as procs:
        yield start_stack(procs, tmp)


def served_by(ledger: Ledger, fault: str, route: str) -> bool:
    return any(e.route == route for e in ledger.of(fault))


def test_gateway_killed_everything_falls_back_then_the_remote_is_used_again(stack: Stack) -> None:
    ledger = Ledger(stack.router)
    with ledger.traffic("gateway killed"):
        wait_for(lambda: served_by(ledger, "gateway killed", "remote"), 30, "traffic to use the remote first")
        gateway = proc(stack, "gateway")
        gateway.kill()
        gateway.wait(5)
        # the breaker opens on failed legs, or the status poll marks the remote not ready first
        wait_for(
            lambda: (
                "remote status changed" in (stack.dir / "router.log").read_text()
                or counter(stack.router, "prfaas_router_breaker_open", remote="prfaas-h200") == 1
            ),
            30,
            "the router to stop using the lost remote",
        )
        stopped = time.monotonic()
        wait_for(lambda: sum(e.sent_s > stopped for e in ledger.of("gateway killed")) >= 8, 60, "traffic")
    ledger.assert_all_answered("gateway killed")
    after_kill = [e for e in ledger.of("gateway killed") if e.sent_s > stopped]
    assert after_kill and all(e.route != "remote" for e in after_kill)
    restart(stack, "gateway")
    healed = time.monotonic()
    with ledger.traffic("gateway restored"):
        wait_for(lambda: served_by(ledger, "gateway restored", "remote"), 60, "the remote to be used again")
    ledger.assert_all_answered("gateway restored")
    first = min(e.sent_s + e.seconds for e in ledger.of("gateway restored") if e.route == "remote")
    # the breaker may have opened while the gateway was gone; the first remote success closes it, and the gauge
    # follows at the router's next refresh
    wait_for(
        lambda: counter(stack.router, "prfaas_router_breaker_open", remote="prfaas-h200") == 0,
        30,
        "the breaker gauge to show the breaker closed",
    )
    record(
        "gateway killed",
        answered=ledger.summary("gateway killed"),
        recovered_s=round(first - healed, 2),
        fallbacks=counter(stack.router, "prfaas_router_fallbacks_total"),
        breaker_opened=counter(stack.router, "prfaas_router_breaker_transitions_total", to="open"),
        metric="prfaas_router_fallbacks_total, prfaas_router_breaker_transitions_total, prfaas_router_breaker_open",
        log="remote status changed / breaker transition / remote prefill failed; prefilling locally",
    )


def test_a_prefill_engine_failing_half_its_requests_costs_no_request(stack: Stack) -> None:
    ledger = Ledger(stack.router)
    retries = counter(stack.router, "prfaas_router_prefill_retries_total", to="remote", outcome="ok")
    assert http("POST", stack.url("pdp") + "/admin/faults", {"error_rate": 0.5})[0] == 200
    try:
        with ledger.traffic("PD prefill 50% 5xx", long_every=4):
            wait_for(lambda: len(ledger.of("PD prefill 50% 5xx")) >= 16, 60, "traffic")
    finally:
        http("POST", stack.url("pdp") + "/admin/faults", {"error_rate": 0.0})
    ledger.assert_all_answered("PD prefill 50% 5xx")
    summary = ledger.summary("PD prefill 50% 5xx")
    assert summary.get("clean-error", 0) == 0 and summary.get("retry", 0) >= 1
    assert counter(stack.router, "prfaas_router_prefill_retries_total", to="remote", outcome="ok") > retries
    record(
        "PD prefill 50% 5xx",
        answered=summary,
        recovered_s=0.0,
        metric="prfaas_router_prefill_retries_total{to,outcome}",
        log="prefill failed; retrying once",
    )


def test_the_only_decode_killed_gives_clean_errors_and_not_ready_then_recovers(stack: Stack) -> None:
    ledger = Ledger(stack.router)
    pdd = proc(stack, "pdd")
    http("POST", stack.url("pdd") + "/admin/faults", {"die": True})
    pdd.wait(10)
    with ledger.traffic("decode killed"):

        def not_ready() -> str | None:
            status, body = http("GET", stack.router + "/ready", timeout_s=5)
            return body["error"]["message"] if status == 503 else None

        why = wait_for(not_ready, 30, "the router to report not ready")
        wait_for(lambda: len(ledger.of("decode killed")) >= 8, 60, "traffic")
    assert "no healthy, non-draining decode instance" in why
    ledger.assert_all_answered("decode killed")
    assert ledger.summary("decode killed").get("clean-error", 0) >= 1
    log = (stack.dir / "router.log").read_text()
    assert "router not ready" in log and "engine health changed" in log
    restart(stack, "pdd")
    healed = time.monotonic()
    with ledger.traffic("decode restarted"):
        wait_for(lambda: http("GET", stack.router + "/ready", timeout_s=5)[0] == 200, 60, "ready again")
        wait_for(lambda: served_by(ledger, "decode restarted", "local"), 60, "a local answer again")
    ledger.assert_all_answered("decode restarted")
    first = min(e.sent_s + e.seconds for e in ledger.of("decode restarted") if e.status == 200)
    record(
        "decode killed (no loop in this stack)",
        answered=ledger.summary("decode killed"),
        recovered_s=round(first - healed, 2),
        metric="prfaas_router_ready, prfaas_router_engine_healthy{engine}",
        log="router not ready / engine health changed",
    )


@pytest.mark.slow
def test_link_squeezed_to_5_percent_then_cut_then_restored(stack: Stack) -> None:
    ledger = Ledger(stack.router)
    admin = stack.url("link_admin") + "/admin/link"
    try:
        assert http("POST", admin, {"capacity_gbps": 5.0})[0] == 200
        with ledger.traffic("link at 5%"):
            wait_for(lambda: len(ledger.of("link at 5%")) >= 12, 120, "traffic")
        assert http("POST", admin, {"capacity_gbps": 0.001})[0] == 200
        with ledger.traffic("link cut"):
            wait_for(lambda: len(ledger.of("link cut")) >= 8, 180, "traffic")
    finally:
        http("POST", admin, {"capacity_gbps": 100.0})
    ledger.assert_all_answered("link at 5%")
    ledger.assert_all_answered("link cut")
    healed = time.monotonic()
    with ledger.traffic("link restored"):
        wait_for(lambda: served_by(ledger, "link restored", "remote"), 120, "the remote to be used again")
    first = min(e.sent_s + e.seconds for e in ledger.of("link restored") if e.route == "remote")
    record("link 5% then cut", answered=ledger.summary("link cut"), recovered_s=round(first - healed, 2))


@pytest.mark.slow
def test_a_frozen_prfaas_engine_falls_back_and_recovers(stack: Stack) -> None:
    ledger = Ledger(stack.router)
    prf = proc(stack, "prf")
    os.kill(prf.pid, signal.SIGSTOP)
    try:
        with ledger.traffic("PrFaaS engine frozen"):
            wait_for(lambda: len(ledger.of("PrFaaS engine frozen")) >= 8, 120, "traffic")
    finally:
        os.kill(prf.pid, signal.SIGCONT)
    ledger.assert_all_answered("PrFaaS engine frozen")
    healed = time.monotonic()
    with ledger.traffic("PrFaaS engine thawed"):
        wait_for(lambda: served_by(ledger, "PrFaaS engine thawed", "remote"), 120, "the remote to be used again")
    first = min(e.sent_s + e.seconds for e in ledger.of("PrFaaS engine thawed") if e.route == "remote")
    record(
        "PrFaaS engine frozen", answered=ledger.summary("PrFaaS engine frozen"), recovered_s=round(first - healed, 2)
    )


def test_ledger_counts_a_hang_as_lost(tmp_path: Path) -> None:
    """The ledger itself can fail: a request past the client's timeout is lost."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)  # accepts, never answers
        ledger = Ledger(f"http://127.0.0.1:{s.getsockname()[1]}")
        with httpx.Client(timeout=0.3) as client:
            entry = ledger.send(client, "hang", 10)
    assert entry.outcome == "lost"
    with pytest.raises(AssertionError, match="1 of 1 lost"):
        ledger.assert_all_answered("hang")
