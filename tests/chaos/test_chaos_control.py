"""Chaos in the control plane: the operator as a real process against the Kubernetes API emulator over HTTP and a
real Prometheus (``prfaas_testbed.operator_harness``, TESTING.md), PDCluster period 1 s, hysteresis 2 cycles.

* Prometheus stopped for several loop periods while a queue stands that would call for a flip, then restarted:
  every cycle holds (``Degraded``, reason ``PrometheusUnavailable``), nothing flips, and the condition clears
  once Prometheus answers again.
* The operator SIGKILLed in the middle of a flip (``slow``; its Drain done, the instance still busy) and
  restarted: the successor takes the Lease and, the queue still standing, finishes the flip (resumed, or rolled
  back and decided anew) exactly once, and nothing changes over the next cycles (no thrash).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ledger import record
from testbed_support import metric_value

from prfaas_core.names import LABEL_DRAINING
from prfaas_testbed.operator_harness import Harness, OperatorProcess
from prfaas_testbed.prom import wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    try:
        yield harness
    finally:
        harness.close()


def decisions(h: Harness, ns: str) -> list[dict]:
    return list(h.status(ns).get("decisions") or [])


def flips(h: Harness, ns: str) -> list[dict]:
    return [d for d in decisions(h, ns) if d["action"].startswith("Flip")]


def holds_without_metrics(op: OperatorProcess) -> float:
    try:
        text = op.metrics()
        return metric_value(text, "prfaas_operator_prometheus_errors_total", {"reason": "PrometheusUnavailable"})
    except KeyError:
        return 0.0


def cycles(op: OperatorProcess) -> float:
    try:
        return metric_value(op.metrics(), "prfaas_operator_cycle_duration_seconds_count", {})
    except KeyError:
        return 0.0


def test_prometheus_stopped_for_several_periods_holds_degrades_and_recovers(h: Harness) -> None:
    ns = h.namespace()
    op = h.start_operator(ns)
    h.setup(ns)
    h.ready_roles(ns, 3, 5, 30)
    wait_until(lambda: h.condition(ns, "Degraded").get("status") == "False", 30, "metrics flowing")
    before = holds_without_metrics(op)
    h.prom.stop_prometheus()
    try:
        h.prom.exporter.set_queue(ns, "pd-h20", "prefill", 40)  # observed, this would flip a decode instance
        wait_until(lambda: holds_without_metrics(op) >= before + 4, 60, "four loop periods without Prometheus")
        cond = h.condition(ns, "Degraded")
        assert cond["status"] == "True" and cond["reason"] == "PrometheusUnavailable", cond
        assert "holding the last decision" in cond["message"]
        assert flips(h, ns) == [] and sorted(h.roles(ns).values()).count("prefill") == 3
        held = holds_without_metrics(op) - before
    finally:
        h.prom.exporter.set_queue(ns, "pd-h20", "prefill", 0)
        h.prom.restart_prometheus()
    restarted = time.monotonic()
    wait_until(lambda: h.condition(ns, "Degraded").get("status") == "False", 60, "Degraded to clear")
    recovered = time.monotonic() - restarted
    assert flips(h, ns) == [] and sorted(h.roles(ns).values()).count("prefill") == 3
    assert "holding: no metrics" in op.logs()
    record(
        "Prometheus stopped (operator loop)",
        answered={"held cycles": int(held), "flips": 0},
        recovered_s=round(recovered, 2),
        metric='prfaas_operator_prometheus_errors_total{reason="PrometheusUnavailable"}; Degraded condition',
        log="holding: no metrics",
    )
    op.stop()


@pytest.mark.slow
def test_operator_killed_mid_flip_the_successor_finishes_it_once(h: Harness) -> None:
    ns = h.namespace()
    op = h.start_operator(ns)
    h.setup(ns)
    roles = h.ready_roles(ns, 3, 5, 30)
    decode = [n for n, r in roles.items() if r == "decode"]
    for pod in decode:  # every decode instance busy: the drain the flip needs cannot finish yet
        h.prom.exporter.running[(ns, pod)] = 2
    h.prom.exporter.set_queue(ns, "pd-h20", "prefill", 40)
    wait_until(lambda: any(d["action"] == "Drain" for d in decisions(h, ns)), 60, "the flip's drain to start")
    pods = h.list("Pod", ns)
    draining = [p["metadata"]["name"] for p in pods if LABEL_DRAINING in (p["metadata"].get("labels") or {})]
    assert len(draining) == 1 and flips(h, ns) == []
    op.stop(signal.SIGKILL)  # mid-flip: drained label set, the role not changed yet
    killed = time.monotonic()
    successor = h.start_operator(ns)
    for pod in decode:  # the requests in flight finish
        h.prom.exporter.running[(ns, pod)] = 0

    def flipped() -> dict[str, str] | None:
        now = h.roles(ns)
        got = sorted(now.values())
        labels = [(p["metadata"].get("labels") or {}) for p in h.list("Pod", ns)]
        done = got.count("prefill") == 4 and got.count("decode") == 4 and flips(h, ns)
        return now if done and not any(LABEL_DRAINING in lb for lb in labels) else None

    # with the queue still standing the flip is still right: the successor finishes it (or rolls it back and
    # decides it anew), once
    final = wait_until(flipped, 120, "the successor to finish the flip")
    recovered = time.monotonic() - killed
    # no thrash: several more cycles with the queue still standing change nothing (the cooldown holds)
    seen = cycles(successor)
    wait_until(lambda: cycles(successor) >= seen + 4, 60, "four more cycles")
    assert h.roles(ns) == final
    assert len(flips(h, ns)) == 1, flips(h, ns)
    actions = [d["action"] for d in decisions(h, ns)]
    h.prom.exporter.set_queue(ns, "pd-h20", "prefill", 0)
    record(
        "operator killed mid-flip",
        answered={"flips": len(flips(h, ns)), "decisions": actions, "drained first": draining[0]},
        recovered_s=round(recovered, 2),
        metric='prfaas_operator_decisions_total{action="FlipToPrefill"}; status.decisions',
        log="decision (FlipToPrefill) by the successor after the Lease changed hands",
    )
    successor.stop()
