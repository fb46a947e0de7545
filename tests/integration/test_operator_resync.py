"""The operator's periodic re-list, against the emulator: an object whose watch events were lost is found and
reconciled within one resync period; one that vanished without a DELETED event is dropped and its ConfigMap
removed; a failing list is logged, counted and retried, never fatal.

Events are lost by filtering the emulator's event bus for one object (the API calls themselves succeed, every
reader but the watch sees the change): exactly what a dropped watch event looks like to the operator."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from prfaas_router.state.metrics import sample_sum
from prfaas_testbed.operator_harness import Harness
from prfaas_testbed.prom import wait_until

pytestmark = pytest.mark.timeout(180)

RESYNC_S = 2.0


class _BlindBus:
    """Stands in for kmock's event bus of one resource while writes go through it: events of one object are
    dropped, the others passed on. Open watch streams keep reading the real bus."""

    def __init__(self, bus: Any, name: str) -> None:
        self.bus, self.name = bus, name
        self.dropped: list[dict[str, Any]] = []

    async def put(self, *events: dict[str, Any]) -> None:
        keep = [e for e in events if (e.get("object") or {}).get("metadata", {}).get("name") != self.name]
        self.dropped += [e for e in events if e not in keep]
        if keep:
            await self.bus.put(*keep)

    def __aiter__(self) -> Any:  # a watch opened meanwhile reads the real bus
        return self.bus.__aiter__()

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.bus, attr)


@contextlib.contextmanager
def watch_blind_to(h: Harness, plural: str, name: str) -> Iterator[list[dict[str, Any]]]:
    """Drop every watch event of the object ``plural/name`` while the block runs; yields the dropped events.
    (kmock fans each write out through one bus per resource; the operator's watch must already be open.)"""
    buses = h.emu.k8s._buses
    resource = next(r for r in list(buses) if r.plural == plural)
    blind = _BlindBus(buses[resource], name)
    buses[resource] = blind
    try:
        yield blind.dropped
    finally:
        buses[resource] = blind.bus


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` (0 when absent)."""
    return sample_sum(text, name, labels) or 0.0


def test_missed_creation_is_reconciled_and_vanished_object_cleaned_up_by_the_resync(h: Harness) -> None:
    ns = h.namespace()
    op = h.start_operator(ns, resync_s=RESYNC_S)
    h.setup(ns, except_kinds=("PDCluster",))  # pods, workload and the other kinds: announced as usual
    pd = next(d for d in h.manifests(ns) if d["kind"] == "PDCluster")
    with watch_blind_to(h, "pdclusters", "pd-h20") as dropped:
        h.create(pd)
    assert [e["type"] for e in dropped] == ["ADDED"]  # it exists for every reader but the watch
    # the next re-list finds it: reconciled as if announced (status, roles assigned, router ConfigMap)
    cond = wait_until(lambda: h.condition(ns, "Ready") or None, 6 * RESYNC_S + 10, "the missed PDCluster reconciled")
    assert cond["status"] == "True", cond
    h.ready_roles(ns, 3, 5, 30)
    wait_until(lambda: h.get("ConfigMap", ns, "pd-h20-router-config"), 20, "its router ConfigMap")
    text = op.metrics()
    assert metric(text, "prfaas_operator_resync_repairs_total", kind="PDCluster", action="add") == 1.0
    assert metric(text, "prfaas_operator_resyncs_total", result="ok") >= 1.0
    assert '"kind": "PDCluster"' in op.logs() and "resync repaired the cache" in op.logs()

    # now it vanishes without a DELETED event reaching the operator (its finalizer force-removed, then deleted,
    # while events were lost): the re-list drops it from the cache and the leader removes the ConfigMap it owned
    with watch_blind_to(h, "pdclusters", "pd-h20") as dropped:
        h.patch("PDCluster", ns, "pd-h20", {"metadata": {"finalizers": None}})
        h.delete("PDCluster", ns, "pd-h20")
        wait_until(lambda: h.get("ConfigMap", ns, "pd-h20-router-config") is None, 6 * RESYNC_S + 10, "cleanup")
    assert "DELETED" in [e["type"] for e in dropped]
    text = op.metrics()
    assert metric(text, "prfaas_operator_resync_repairs_total", kind="PDCluster", action="remove") == 1.0
    # what the watch announced was never missing
    assert metric(text, "prfaas_operator_resync_repairs_total", kind="InterDCLink", action="add") == 0.0
    assert op.proc.poll() is None
    op.stop()


def test_a_failing_list_is_logged_counted_and_retried_next_period(h: Harness) -> None:
    ns = h.namespace()
    op = h.start_operator(ns, resync_s=RESYNC_S)
    # the operator's client retries a 503 five times: six answers fail one whole resync
    fault = h.emu.k8s.inject("GET", rf"/namespaces/{ns}/interdclinks$", 503, count=6)
    wait_until(lambda: metric(op.metrics(), "prfaas_operator_resyncs_total", result="error") >= 1, 40, "a failure")
    assert fault.hits == 6
    assert "resync failed; retrying next period" in op.logs()
    ok = metric(op.metrics(), "prfaas_operator_resyncs_total", result="ok")
    wait_until(lambda: metric(op.metrics(), "prfaas_operator_resyncs_total", result="ok") > ok, 20, "recovery")
    # and the operator still works: a new object is reconciled as usual
    h.setup(ns)
    wait_until(lambda: h.get("ConfigMap", ns, "pd-h20-router-config"), 40, "router config published")
    assert op.proc.poll() is None
    op.stop()
