"""The operator's one change detector (``StatusWriter`` through ``status_changed``): which status fields alone
are worth a write. Table-driven over the kinds' quiet rules: heartbeat timestamps, measured tolerances, derived
fields, and a nested heartbeat (a repeated Hold's time)."""

from __future__ import annotations

from typing import Any

import pytest

from prfaas_core.names import KIND_INTER_DC_LINK, KIND_MODEL_PROFILE, KIND_PD_CLUSTER, KIND_PREFILL_CLUSTER
from prfaas_operator.status import QUIET_RULES, changed_fields, iso, status_changed

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
