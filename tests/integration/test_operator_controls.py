"""The operator's contract with platform teams and SREs, against the emulator and a real Prometheus:
invalid specs and dangling references, deletion cleanup, pause, dry-run, overrides, one active replica."""

from __future__ import annotations

import time

import pytest

from prfaas_testbed.operator_harness import Harness
from prfaas_testbed.prom import wait_until

pytestmark = pytest.mark.timeout(240)


def test_invalid_spec_and_dangling_reference_get_ready_false_with_events(h: Harness) -> None:
    ns = h.namespace()
    op = h.start_operator(ns)
    docs = h.manifests(ns)
    pd = next(d for d in docs if d["kind"] == "PDCluster")
    pd["spec"]["roles"] = {"prefill": {"min": 5, "max": 7}, "decode": {"min": 5, "max": 7}}  # mins exceed 8
    pd["spec"]["modelProfileRef"] = {"name": "no-such-profile"}
    h.create(pd)
    cond = wait_until(lambda: h.condition(ns, "Ready") or None, 20, "Ready condition")
    assert cond["status"] == "False" and cond["reason"] == "InvalidSpec"
    assert "roles.prefill.min + roles.decode.min exceeds instances" in cond["message"]
    assert h.status(ns)["observedGeneration"] == 1
    event = wait_until(lambda: [e for e in h.events(ns) if e["reason"] == "InvalidSpec"], 10, "an event")[0]
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == "pd-h20"
    # fix the spec: the next problem is the dangling reference, and observedGeneration follows
    h.patch("PDCluster", ns, "pd-h20", {"spec": {"roles": {"prefill": {"min": 1}, "decode": {"min": 1}}}})
    cond = wait_until(
        lambda: h.condition(ns, "Ready") if h.condition(ns, "Ready")["reason"] != "InvalidSpec" else None,
        20,
        "the next condition",
    )
    assert cond["reason"] == "DanglingReference" and "no-such-profile" in cond["message"]
    assert h.status(ns)["observedGeneration"] == 2
    assert any(e["reason"] == "DanglingReference" for e in h.events(ns))
    op.stop()


def test_deleting_a_pdcluster_removes_its_config_map_and_finalizer(h: Harness) -> None:
    ns = h.namespace()
    op = h.start_operator(ns)
    h.setup(ns)
    wait_until(lambda: h.get("ConfigMap", ns, "pd-h20-router-config"), 30, "router config published")
    pd = h.get("PDCluster", ns, "pd-h20")
    assert pd is not None and "prfaas.io/finalizer" in pd["metadata"]["finalizers"]
    cm = h.get("ConfigMap", ns, "pd-h20-router-config")
    assert cm is not None and cm["metadata"]["ownerReferences"][0]["uid"] == pd["metadata"]["uid"]
    h.delete("PDCluster", ns, "pd-h20")
    wait_until(lambda: h.get("PDCluster", ns, "pd-h20") is None, 20, "the PDCluster gone")
    assert h.get("ConfigMap", ns, "pd-h20-router-config") is None
    # other kinds own nothing: no finalizer on them
    link = h.get("InterDCLink", ns, "a-to-b")
    assert link is not None and not link["metadata"].get("finalizers")
    op.stop()


def test_pause_annotation_stops_reconciliation_and_records_it(h: Harness) -> None:
    ns = h.namespace()
    op = h.start_operator(ns)
    h.setup(ns)
    h.ready_roles(ns, 3, 5, 30)
    h.patch("PDCluster", ns, "pd-h20", {"metadata": {"annotations": {"prfaas.io/paused": "true"}}})
    wait_until(lambda: h.condition(ns, "Paused").get("status") == "True", 20, "Paused")
    n = len(h.status(ns).get("decisions") or [])
    h.prom.exporter.set_queue(ns, "pd-h20", "decode", 40)
    time.sleep(5)
    assert len(h.status(ns).get("decisions") or []) == n
    assert sorted(h.roles(ns).values()).count("prefill") == 3
    h.patch("PDCluster", ns, "pd-h20", {"metadata": {"annotations": {"prfaas.io/paused": None}}})
    wait_until(lambda: h.condition(ns, "Paused").get("status") == "False", 20, "resumed")
    h.ready_roles(ns, 2, 6, 30)  # the standing decode queue now flips as usual
    op.stop()


def test_dry_run_records_decisions_but_acts_on_nothing(h: Harness) -> None:
    ns = h.namespace()
    op = h.start_operator(ns)
    h.setup(ns)
    h.ready_roles(ns, 3, 5, 30)
    h.patch("PDCluster", ns, "pd-h20", {"spec": {"policy": {"dryRun": True}}})
    h.prom.exporter.set_queue(ns, "pd-h20", "decode", 40)
    rec = wait_until(
        lambda: [d for d in h.status(ns).get("decisions") or [] if d["action"] == "Drain"], 20, "a dry-run decision"
    )[0]
    assert rec["reason"].startswith("dry-run, not acted on: decode-bound")
    op.wait_cycles(3)
    pods = h.list("Pod", ns)
    assert not any((p["metadata"].get("labels") or {}).get("prfaas.io/draining") for p in pods)
    assert sorted(h.roles(ns).values()).count("prefill") == 3
    assert any(e["reason"] == "Drain" and e["message"].startswith("dry-run") for e in h.events(ns))
    assert 'reason_kind="dry-run"' in op.metrics()
    assert h.condition(ns, "Overridden")["message"] == "policy.dryRun"
    op.stop()


def test_overrides_pin_the_split_and_the_threshold(h: Harness) -> None:
    ns = h.namespace()
    op = h.start_operator(ns)
    h.setup(ns)
    h.ready_roles(ns, 3, 5, 30)
    h.patch("PDCluster", ns, "pd-h20", {"spec": {"overrides": {"prefillInstances": 5, "thresholdTokens": 50000}}})
    h.ready_roles(ns, 5, 3, 40)  # two steps, each drained first
    st = wait_until(lambda: h.status(ns) if h.status(ns).get("thresholdTokens") == 50000 else None, 20, "t pinned")
    assert st["thresholdMinTokens"] == st["thresholdMaxTokens"] == 50000
    assert "manual override: prefill pinned to 5" in " ".join(d["reason"] for d in st["decisions"])
    cond = h.condition(ns, "Overridden")
    assert cond["status"] == "True" and "overrides.prefillInstances=5" in cond["message"]
    cm = h.get("ConfigMap", ns, "pd-h20-router-config")
    assert cm is not None and '"thresholdMaxTokens": 50000' in cm["data"]["router-config.json"]
    op.stop()


def test_two_operator_processes_only_the_lease_holder_acts(h: Harness) -> None:
    # under heavy CPU load a replica's watch can miss the PDCluster's creation event: a short resync repairs it
    ns = h.namespace()
    a = h.start_operator(ns, identity="replica-a", resync_s=3)
    wait_until(
        lambda: (h.get("Lease", ns, f"prfaas-operator-{ns}") or {}).get("spec", {}).get("holderIdentity"),
        20,
        "a Lease holder",
    )
    b = h.start_operator(ns, identity="replica-b", resync_s=3)
    h.setup(ns)
    h.ready_roles(ns, 3, 5, 90)  # two operator processes share 2 cores: generous deadlines
    h.prom.exporter.set_queue(ns, "pd-h20", "decode", 40)
    h.ready_roles(ns, 2, 6, 90)
    lease = h.get("Lease", ns, f"prfaas-operator-{ns}")
    assert lease is not None and lease["spec"]["holderIdentity"] == "replica-a"
    assert "prfaas_operator_leader 1.0" in a.metrics() and "prfaas_operator_leader 0.0" in b.metrics()
    wait_until(lambda: '"action": "FlipToDecode"' in a.logs(), 20, "the leader's decision in its log")
    assert '"action":' not in b.logs()
    # the leader goes away: the standby takes the Lease over and carries on
    a.stop()
    wait_until(
        lambda: h.get("Lease", ns, f"prfaas-operator-{ns}")["spec"].get("holderIdentity") == "replica-b", 20, "takeover"
    )
    wait_until(lambda: "prfaas_operator_leader 1.0" in b.metrics(), 10, "b leads")
    b.stop()
