"""The operator's one change detector (``StatusWriter`` through ``status_changed``): which status fields alone
are worth a write. Table-driven over the kinds' quiet rules: heartbeat timestamps, measured tolerances, derived
fields, and a nested heartbeat (a repeated Hold's time)."""

from __future__ import annotations

from typing import Any

import pytest

from prfaas_core.api import Condition
from prfaas_core.names import KIND_INTER_DC_LINK, KIND_MODEL_PROFILE, KIND_PD_CLUSTER, KIND_PREFILL_CLUSTER
from prfaas_operator.registry import Entry
from prfaas_operator.status import QUIET_RULES, changed_fields, iso, set_condition, status_changed
from prfaas_operator.writer import HEARTBEAT_CYCLES, StatusWriter, heartbeat_phase

T0 = 1_800_000_000.0
LINK = {
    "measuredEgressGbps": 2.0,
    "utilization": 0.02,
    "utilizationPercent": "2%",
    "state": "Abundant",
    "thresholdFloorTokens": 10_000,
    "lastMeasuredTime": iso(T0),
}
PFC = {"readyInstances": 4, "queueDepth": 3.0, "egressGbps": 10.0, "lastSyncTime": iso(T0)}
HOLD = {"time": iso(T0), "action": "Hold", "reason": "no standing queue", "prefillFrom": 1, "decodeFrom": 3}
COOL = {
    **HOLD,
    "reason": "prefill-bound: queues: PD-P 40, PrFaaS 0, PD-D 0 (> 8 per prefill instance); cooldown: last flip "
    "12 s ago < 3600 s",
}
COOL_LATER = (
    "prefill-bound: queues: PD-P 41, PrFaaS 0, PD-D 0 (> 8 per prefill instance); cooldown: last flip 13 s ago < 3600 s"
)


@pytest.mark.parametrize(
    ("kind", "old", "new", "changed"),
    [
        # the link: a fresh timestamp and jitter inside the tolerances are not a write
        (KIND_INTER_DC_LINK, LINK, {**LINK, "lastMeasuredTime": iso(T0 + 30)}, False),
        (KIND_INTER_DC_LINK, LINK, {**LINK, "measuredEgressGbps": 2.4, "utilization": 0.024}, False),
        (KIND_INTER_DC_LINK, LINK, {**LINK, "thresholdFloorTokens": 10_150}, False),
        (KIND_INTER_DC_LINK, LINK, {**LINK, "utilizationPercent": "3%"}, False),
        # ... past them, a state flip, or a stale heartbeat is
        (KIND_INTER_DC_LINK, LINK, {**LINK, "utilization": 0.035, "lastMeasuredTime": iso(T0 + 30)}, True),
        (KIND_INTER_DC_LINK, LINK, {**LINK, "thresholdFloorTokens": 10_300}, True),
        (KIND_INTER_DC_LINK, LINK, {**LINK, "state": "Scarce"}, True),
        (KIND_INTER_DC_LINK, LINK, {**LINK, "lastMeasuredTime": iso(T0 + 300)}, True),
        (KIND_INTER_DC_LINK, {**LINK, "utilization": None}, LINK, True),  # a value appearing always counts
        (KIND_INTER_DC_LINK, {"state": "Abundant"}, LINK, True),  # no timestamp yet
        # the PrefillCluster: queue within one request, throughput and egress within 5 %
        (KIND_PREFILL_CLUSTER, PFC, {**PFC, "queueDepth": 3.9, "egressGbps": 10.4}, False),
        (KIND_PREFILL_CLUSTER, PFC, {**PFC, "queueDepth": 4.5}, True),
        (KIND_PREFILL_CLUSTER, PFC, {**PFC, "egressGbps": 11.0}, True),
        (KIND_PREFILL_CLUSTER, PFC, {**PFC, "readyInstances": 3}, True),  # counts are exact
        # the PDCluster: a repeated Hold keeps its first time; anything else about it is a change
        (KIND_PD_CLUSTER, {"lastDecision": HOLD}, {"lastDecision": {**HOLD, "time": iso(T0 + 60)}}, False),
        (KIND_PD_CLUSTER, {"lastDecision": HOLD}, {"lastDecision": {**HOLD, "time": iso(T0 + 600)}}, True),
        (KIND_PD_CLUSTER, {"lastDecision": HOLD}, {"lastDecision": {**HOLD, "reason": "queue 42 > 30"}}, True),
        # ... and a Hold whose reason moved only in its figures (queues, seconds since the last flip) is the same
        # Hold, rewritten with the heartbeat
        (KIND_PD_CLUSTER, {"lastDecision": COOL}, {"lastDecision": {**COOL, "reason": COOL_LATER}}, False),
        (KIND_PD_CLUSTER, {"lastDecision": COOL}, {"lastDecision": {**COOL, "prefillTo": 2}}, True),
        (KIND_PD_CLUSTER, {}, {"lastDecision": HOLD}, True),
        # a kind without a rule is compared exactly
        (KIND_MODEL_PROFILE, {"x": 1.0}, {"x": 1.0000001}, True),
        (KIND_MODEL_PROFILE, {"x": 1.0}, {"x": 1.0}, False),
    ],
)
def test_status_changed_by_rule(kind: str, old: dict[str, Any], new: dict[str, Any], changed: bool) -> None:
    assert status_changed(old, new, QUIET_RULES.get(kind), heartbeat_s=300) is changed


def test_heartbeat_is_a_parameter() -> None:
    new = {**LINK, "lastMeasuredTime": iso(T0 + 5)}
    assert not status_changed(LINK, new, QUIET_RULES[KIND_INTER_DC_LINK], heartbeat_s=300)
    assert status_changed(LINK, new, QUIET_RULES[KIND_INTER_DC_LINK], heartbeat_s=5)


def test_changed_fields_names_what_moved() -> None:
    """The writer counts its writes by these (the operator's ``cycle`` line, ``status_moved``)."""
    rule = QUIET_RULES[KIND_INTER_DC_LINK]
    new = {**LINK, "state": "Scarce", "utilization": 0.5, "lastMeasuredTime": iso(T0 + 30)}
    assert changed_fields(LINK, new, rule, heartbeat_s=300) == ["utilization", "state"]
    assert changed_fields(LINK, LINK, rule, heartbeat_s=300) == []


def test_a_condition_set_again_keeps_its_place() -> None:
    """The list's order is compared: a condition set again in another order than last time must not move."""
    conds = set_condition([], "Drained", False, "InService", "in service", T0, 1)
    conds = set_condition(conds, "Ready", True, "GatewaySynced", "synced", T0, 1)
    again = set_condition(conds, "Drained", False, "InService", "in service", T0 + 30, 1)
    assert [c.type for c in again] == ["Drained", "Ready"] and again == conds
    flipped = set_condition(conds, "Drained", True, "Drained", "drained", T0 + 30, 1)
    assert [c.type for c in flipped] == ["Drained", "Ready"] and flipped[0].last_transition_time == iso(T0 + 30)
    assert all(isinstance(c, Condition) for c in flipped)


def entry(name: str, kind: str = KIND_PREFILL_CLUSTER) -> Entry:
    return Entry(kind, {"metadata": {"namespace": "ns", "name": name}})


def test_heartbeat_stretches_with_long_cycles_and_is_spread_over_objects() -> None:
    """At thousands of objects a cycle can take as long as the heartbeat: the heartbeat then stretches to
    HEARTBEAT_CYCLES cycles, and each object's falls at its own fixed offset, so at most a small fraction
    heartbeat in any one cycle (the 5,000-cluster run had rewritten every timestamp every cycle)."""
    writer = StatusWriter(None, None, heartbeat_s=300)  # type: ignore[arg-type]  # only its rule is used here
    assert writer.interval_s == 300
    writer.cycle_took(2.0)
    assert writer.interval_s == 300  # short cycles: the configured heartbeat
    writer.cycle_took(300.0)
    assert writer.interval_s == HEARTBEAT_CYCLES * 300
    entries = [entry(f"pfc-{i}") for i in range(1000)]
    beats = [writer.heartbeat_of(e) for e in entries]
    assert all(writer.interval_s <= b < 2 * writer.interval_s for b in beats)
    assert beats == [writer.heartbeat_of(e) for e in entries]  # fixed per object
    # objects all written in one cycle: in any later cycle of 300 s only a few of them are due
    phases = sorted(heartbeat_phase(e) for e in entries)
    width = 300.0 / writer.interval_s
    worst = max(sum(1 for p in phases if lo <= p < lo + width) for lo in (i / 100 for i in range(100)))
    assert worst <= 0.1 * len(entries)
    # the stale timestamp is written once its object's own heartbeat is due
    old, rule = {"lastSyncTime": iso(T0)}, QUIET_RULES[KIND_PREFILL_CLUSTER]
    first = entries[0]
    due = writer.heartbeat_of(first)
    assert not status_changed(old, {"lastSyncTime": iso(T0 + due - 1)}, rule, due)
    assert status_changed(old, {"lastSyncTime": iso(T0 + due + 1)}, rule, due)
    # --status-heartbeat-cycles 0: the heartbeat seconds alone, however long the cycles
    plain = StatusWriter(None, None, heartbeat_s=2, heartbeat_cycles=0)  # type: ignore[arg-type]
    plain.cycle_took(300.0)
    assert plain.interval_s == 2 and 2 <= plain.heartbeat_of(first) < 4
