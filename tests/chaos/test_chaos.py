"""Chaos on the emulated two-datacenter stack (prfaas_local.stack, through tests/integration/testbed_support.py):
one fault at a time while traffic flows, a ledger of every request (ledger.py), and the recovery after the fault
heals.

The default run takes the short subset (marker ``chaos``): the gateway killed and restarted, a PD prefill engine
failing half its requests, the only decode engine killed and restarted (and, in sibling files, the decode killed
under ``prfaas up``'s loop and Prometheus stopped). ``--full`` adds ``chaos and slow``:
the link squeezed to 5 % of its capacity and cut, a PrFaaS engine frozen. Each case asserts every request got
an answer (success, fallback, retry, or a clean documented error) and that the system recovers; the measured
table goes to ``$PRFAAS_CHAOS_TABLE`` when set.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from ledger import Ledger, record
from testbed_support import ALIASES, Stack, counter, http, metric_value, processes, start_stack, wait_for

from prfaas_link.config import LinkConfig
from prfaas_link.relay import PACER_LOOKAHEAD_S

pytestmark = pytest.mark.chaos


def proc(stack: Stack, name: str) -> subprocess.Popen[bytes]:
    return [p for n, p in stack.procs.procs if n == ALIASES.get(name, name)][-1]


def restart(stack: Stack, name: str) -> None:
    old = proc(stack, name)
    stack.procs.start(ALIASES.get(name, name), [str(a) for a in old.args])  # type: ignore[union-attr]


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


class LinkMeter:
    """Samples the link relay's own accounting while a block runs: its wire-byte counter (cumulative) and its
    1-s utilisation (egress over the last second / the capacity in force)."""

    def __init__(self, admin: str) -> None:
        self.admin = admin
        self.samples: list[tuple[float, float, float]] = []  # (monotonic s, wire bytes, 1-s utilisation)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.is_set():
                try:
                    state = client.get(self.admin + "/admin/state").json()
                    text = client.get(self.admin + "/metrics").text
                    wire = metric_value(text, "prfaas_link_wire_bytes_total", {"link": "a-to-b"})
                    self.samples.append((time.monotonic(), wire, float(state["utilization"])))
                except (httpx.HTTPError, KeyError, ValueError):
                    pass
                self._stop.wait(0.2)

    def __enter__(self) -> LinkMeter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.mark.slow
def test_link_squeezed_to_5_percent_then_cut_then_restored(stack: Stack) -> None:
    """Every request answered while the link carries 5 % of its capacity and while it is cut, and the link never
    carries more than the capacity in force: by the relay's own byte counter, cumulatively from a second after
    the squeeze (bytes <= rate x elapsed + what the pacer may grant ahead + one chunk), and its 1-s windows."""
    ledger = Ledger(stack.router)
    admin = stack.url("link_admin")
    try:
        squeezed = http("POST", admin + "/admin/link", {"capacity_gbps": 5.0})
        assert squeezed[0] == 200
        rate = float(squeezed[1]["wire_rate_bytes_per_s"])
        with ledger.traffic("link at 5%", workers=4, long_every=1):  # long prompts only: KV on the link
            # once a remote prefill's KV has crossed at 5 %, what the pacer granted at the old rate (its lookahead)
            # is long delivered
            wait_for(lambda: served_by(ledger, "link at 5%", "remote"), 120, "a remote prefill over the squeezed link")
            with LinkMeter(admin) as meter:
                wait_for(lambda: len(ledger.of("link at 5%")) >= 12 and len(meter.samples) >= 10, 120, "traffic")
        assert http("POST", admin + "/admin/link", {"capacity_gbps": 0.001})[0] == 200
        with ledger.traffic("link cut"):
            wait_for(lambda: len(ledger.of("link cut")) >= 8, 180, "traffic")
    finally:
        http("POST", admin + "/admin/link", {"capacity_gbps": 100.0})
    ledger.assert_all_answered("link at 5%")
    ledger.assert_all_answered("link cut")
    (t0, wire0, _), (t1, wire1, _) = meter.samples[0], meter.samples[-1]
    chunk = next(f.default for f in dataclasses.fields(LinkConfig) if f.name == "chunk_bytes")
    allowance = rate * PACER_LOOKAHEAD_S + chunk
    assert wire1 - wire0 <= rate * (t1 - t0) + allowance, (wire1 - wire0, rate * (t1 - t0))
    assert wire1 > wire0  # KV did cross the squeezed link
    peak = max(u for _, _, u in meter.samples)
    healed = time.monotonic()
    with ledger.traffic("link restored"):
        wait_for(lambda: served_by(ledger, "link restored", "remote"), 120, "the remote to be used again")
    first = min(e.sent_s + e.seconds for e in ledger.of("link restored") if e.route == "remote")
    record(
        "link at 5% then cut",
        answered={**ledger.summary("link at 5%"), **{f"cut {k}": v for k, v in ledger.summary("link cut").items()}},
        recovered_s=round(first - healed, 2),
        egress_vs_capacity=round((wire1 - wire0) / (rate * (t1 - t0)), 3),
        peak_1s_utilisation=round(peak, 3),
        metric="prfaas_link_wire_bytes_total, prfaas_link_utilization_ratio; prfaas_router_fallbacks_total",
        log="remote prefill failed; prefilling locally / decode could not use the remote KV",
    )


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
        "PrFaaS engine frozen",
        answered=ledger.summary("PrFaaS engine frozen"),
        recovered_s=round(first - healed, 2),
        metric="prfaas_router_fallbacks_total; prfaas_router_engine_healthy (gateway)",
        log="legs in flight cut short / engine health changed / remote prefill failed; prefilling locally",
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
