"""The operator as a real process against the Kubernetes API emulator and a real Prometheus: the long-term
loop's behaviour end to end (flip after persistence + drain, steady load, Prometheus down, restart, retries)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from prfaas_testbed.operator_harness import Harness
from prfaas_testbed.prom import wait_until

pytestmark = pytest.mark.timeout(240)


def decisions(h: Harness, ns: str) -> list[dict]:
    return list(h.status(ns).get("decisions") or [])


def flips(h: Harness, ns: str) -> list[dict]:
    return [d for d in decisions(h, ns) if d["action"].startswith("Flip")]


def test_load_shift_towards_prefill_flips_one_instance_after_persistence_and_drain(h: Harness) -> None:
    ns = h.namespace()
    op = h.start_operator(ns)
    h.setup(ns)
    h.ready_roles(ns, 3, 5, 30)
    t_before = wait_until(lambda: h.status(ns).get("thresholdMinTokens"), 30, "t_min published")
    busy = next(n for n, r in sorted(h.roles(ns).items()) if r == "decode")
    h.prom.exporter.running[(ns, busy)] = 3  # work in flight: the drain must pick another instance first
    h.prom.exporter.set_queue(ns, "pd-h20", "prefill", 40)
    # persistence (2 cycles of 1 s) + one cycle + the drain poll, plus Prometheus' 1 s scrape; ready_roles waits
    # on the condition (no wall-clock assertion: a loaded machine only makes it slower, not wrong)
    roles = h.ready_roles(ns, 4, 4, 60)
    assert roles[busy] == "decode"
    st = wait_until(lambda: h.status(ns) if flips(h, ns) else None, 20, "the flip recorded")
    flip = flips(h, ns)[-1]
    assert flip["action"] == "FlipToPrefill" and "prefill-bound" in flip["reason"] and "drained" in flip["reason"]
    assert (flip["prefillFrom"], flip["prefillTo"], flip["decodeTo"]) == (3, 4, 4)
    actions = [d["action"] for d in decisions(h, ns)]
    assert actions.index("Drain") < actions.index("FlipToPrefill")
    assert "(1 of 2 cycles)" in " ".join(d["reason"] for d in decisions(h, ns))
    # t re-optimised for the new split: more local prefill capacity -> a larger t_min, published to routers
    assert st["thresholdMinTokens"] > t_before
    cm = wait_until(lambda: h.get("ConfigMap", ns, "pd-h20-router-config"), 10, "router config")
    assert f'"thresholdMinTokens": {st["thresholdMinTokens"]}' in cm["data"]["router-config.json"]
    assert st["summary"]["prefill"] == "4/4" and st["lastDecision"]["reason"]
    reasons = {e["reason"] for e in h.events(ns)}
    assert {"Drain", "FlipToPrefill"} <= reasons
    text = op.metrics()
    assert 'prfaas_operator_decisions_total{action="FlipToPrefill"' in text
    assert f'prfaas_operator_role_instances{{namespace="{ns}",pd_cluster="pd-h20",role="prefill"}} 4.0' in text
    # JSON logs carry the resource in every decision line
    assert f'"namespace": "{ns}", "name": "pd-h20", "action": "FlipToPrefill"' in op.logs()
    # a restart converges without an extra flip: the cooldown comes back from the pods and the status
    op.stop()
    op2 = h.start_operator(ns)
    wait_until(lambda: op2.metrics().count("prfaas_operator_decisions_total{") >= 1, 30, "cycles after restart")
    op2.wait_cycles(3)  # a few 1 s periods with the queue still standing: the 3600 s cooldown must hold
    assert len(flips(h, ns)) == 1
    assert sorted(h.roles(ns).values()).count("prefill") == 4
    held = h.status(ns)
    assert "cooldown" in held["lastDecision"]["reason"]
    # held at rest, the PD cluster writes no status: each cycle's Hold says "last flip N s ago" with a new N and
    # the verdict's streak grows, but neither is a change (the old comparison wrote both every cycle)
    seen = len(pd_writes(op2))
    op2.wait_cycles(4)
    assert sum(pd_writes(op2)[seen:]) == 0, pd_writes(op2)[seen:]
    assert h.status(ns)["lastDecision"] == held["lastDecision"] and decisions(h, ns) == held["decisions"]
    # a measurement that changes the decision's words is written at once: the queue drains
    h.prom.exporter.set_queue(ns, "pd-h20", "prefill", 0)
    last = wait_until(
        lambda: (d := h.status(ns)["lastDecision"]) and "no standing queue" in d["reason"] and d,
        30,
        "the drained queue in the status",
    )
    assert last["action"] == "Hold" and decisions(h, ns)[-1]["reason"] == last["reason"]
    op2.stop()


def pd_writes(op: Any) -> list[int]:
    """Per logged cycle, the PDCluster fields its status writes moved (the cycle line's ``status_moved``)."""
    out = []
    for line in op.logs().splitlines():
        if '"event": "cycle"' in line:
            moved = json.loads(line).get("status_moved") or {}
            out.append(sum(n for k, n in moved.items() if k.startswith("PDCluster.")))
    return out


def test_steady_load_does_not_flip(h: Harness) -> None:
    ns = h.namespace()
    op = h.start_operator(ns)
    h.setup(ns)
    h.ready_roles(ns, 3, 5, 30)
    wait_until(lambda: len(decisions(h, ns)) >= 2, 30, "a few cycles")
    op.wait_cycles(4)
    assert flips(h, ns) == []
    assert sorted(h.roles(ns).values()).count("prefill") == 3
    last = h.status(ns)["lastDecision"]
    assert last["action"] == "Hold" and "no standing queue" in last["reason"]
    assert h.condition(ns, "Degraded")["status"] == "False"
    op.stop()


def test_prometheus_down_holds_the_last_decision_and_degrades(h: Harness) -> None:
    ns = h.namespace()
    op = h.start_operator(ns)
    h.setup(ns)
    h.ready_roles(ns, 3, 5, 30)
    wait_until(lambda: h.condition(ns, "Degraded").get("status") == "False", 30, "metrics flowing")
    h.prom.stop_prometheus()
    try:
        h.prom.exporter.set_queue(ns, "pd-h20", "decode", 40)
        cond = wait_until(
            lambda: h.condition(ns, "Degraded") if h.condition(ns, "Degraded").get("status") == "True" else None,
            20,
            "Degraded",
        )
        assert cond["reason"] == "PrometheusUnavailable" and "holding the last decision" in cond["message"]
        time.sleep(4)
        assert flips(h, ns) == [] and sorted(h.roles(ns).values()).count("prefill") == 3
        assert "prfaas_operator_prometheus_errors_total" in op.metrics()
    finally:
        h.prom.restart_prometheus()
    wait_until(lambda: h.condition(ns, "Degraded").get("status") == "False", 40, "recovery")
    h.prom.exporter.set_queue(ns, "pd-h20", "decode", 0)
    op.stop()


def test_conflicts_and_server_errors_are_retried(h: Harness) -> None:
    ns = h.namespace()
    op = h.start_operator(ns)
    # the first label patches of pods fail with 409 and 503; the operator retries with backoff
    h.emu.k8s.inject("PATCH", rf"/namespaces/{ns}/pods/", 409, count=2)
    h.emu.k8s.inject("PATCH", rf"/namespaces/{ns}/pods/", 503, count=2)
    h.emu.k8s.inject("PATCH", rf"/namespaces/{ns}/pdclusters/pd-h20/status", 500, count=1)
    h.setup(ns)
    h.ready_roles(ns, 3, 5, 40)
    text = op.metrics()
    assert 'prfaas_operator_api_retries_total{status="409"} 2.0' in text
    assert 'prfaas_operator_api_retries_total{status="503"} 2.0' in text
    wait_until(lambda: h.condition(ns, "Ready").get("status") == "True", 20, "Ready")
    op.stop()
