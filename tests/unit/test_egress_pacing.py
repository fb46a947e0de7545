"""Egress pacing (linkScheduling.egressPacing PerInstance): each prefill pod's egress is cap / instances, written by
the operator as Kubernetes' kubernetes.io/egress-bandwidth pod annotation, and the gateway books each pull at that
rate. The pure parts: the rate, the patch of each workload kind, what turning it off removes, and the gateway's
pullGbps; the CRD rule that pacing and a hand-set pullGbps exclude each other."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from prfaas_core.api import PrefillCluster
from prfaas_core.names import ANNOTATION_EGRESS_BANDWIDTH as BW
from prfaas_core.names import ANNOTATION_EGRESS_PACED as MARK
from prfaas_core.names import GBPS_BITS
from prfaas_core.policy.link_calendar import earliest_window, paced_instance_gbps
from prfaas_core.policy.link_state import EgressLedger, LinkParams
from prfaas_operator.pacing import bandwidth_quantity, paced_gbps, pacing_patch
from support.resources import prefill_cluster_doc


def prefill_cluster(**link_scheduling: Any) -> PrefillCluster:
    ls = {"link": "a-to-b", "capacityGbps": 5, "maxUtilization": 0.8, **link_scheduling}
    return PrefillCluster.model_validate(prefill_cluster_doc(ls))


def test_the_paced_rate_is_an_equal_share_of_the_cap() -> None:
    assert paced_instance_gbps(5.0, 0.8, 2) == pytest.approx(2.0)  # two 2-Gbps pulls fill the 4-Gbps cap
    assert paced_instance_gbps(100.0, 0.8, 4) == pytest.approx(20.0)
    for bad in ((0.0, 0.8, 2), (5.0, 0.0, 2), (5.0, 1.5, 2), (5.0, 0.8, 0)):
        with pytest.raises(ValueError):
            paced_instance_gbps(*bad)
    assert bandwidth_quantity(2.0) == "2000M" and bandwidth_quantity(0.0001) == "1M"


def test_paced_pulls_fill_the_cap_where_unpaced_ones_leave_it_partly_idle() -> None:
    """A 5-Gbps link (4-Gbps cap), two PrFaaS instances, two prefills done at once, 10 Gbit of KV each. Unpaced a
    pull runs at its relay's 2.5 Gbps: the second waits for the first (4 s), 2.5 Gbps on the wire. Paced to
    2 Gbps both pull at once: 4 Gbps on the wire, and the second's KV lands 3 s sooner."""
    link = LinkParams("a-to-b", capacity_gbps=5.0, max_utilization=0.8)
    nbytes = 10.0 * GBPS_BITS / 8.0

    def two_pulls(pull_gbps: float) -> tuple[float, float]:
        ledger = EgressLedger(lanes=2)
        ends = []
        for key in ("a", "b"):
            w = earliest_window(ledger, 0.0, nbytes, 1.0, link, "pull-after-prefill", pull_gbps=pull_gbps)
            assert w is not None
            ledger.reserve(key, w.transfer())
            ends.append(w.stream_end_s)
        return ends[0], ends[1]

    unpaced = two_pulls(2.5)
    assert unpaced == (pytest.approx(1.0 + 4.0), pytest.approx(1.0 + 8.0))  # one after the other
    paced = two_pulls(paced_instance_gbps(5.0, 0.8, 2))
    assert paced == (pytest.approx(1.0 + 5.0), pytest.approx(1.0 + 5.0))  # side by side, 2 + 2 = the cap


def test_pacing_is_opt_in_and_excludes_a_hand_set_pull_rate() -> None:
    assert paced_gbps(prefill_cluster()) is None
    assert paced_gbps(prefill_cluster(egressPacing="PerInstance")) == pytest.approx(2.0)
    assert paced_gbps(prefill_cluster(egressPacing="PerInstance", replicas=2)) == pytest.approx(2.0)
    with pytest.raises(ValidationError, match="pullGbps"):
        prefill_cluster(egressPacing="PerInstance", pullGbps=2.5)
    with pytest.raises(ValidationError, match="instanceGbps"):
        prefill_cluster(egressPacing="PerInstance", instanceGbps=2.5)
    with pytest.raises(ValidationError, match="egressPacing"):
        prefill_cluster(egressPacing="Always")


def deployment(template_annotations: dict[str, str] | None = None, marker: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "prefill-engines"}
    if marker is not None:
        meta["annotations"] = {MARK: marker, "other": "kept"}
    template: dict[str, Any] = {"metadata": {"labels": {"app": "x"}}, "spec": {}}
    if template_annotations is not None:
        template["metadata"]["annotations"] = template_annotations
    return {"kind": "Deployment", "metadata": meta, "spec": {"replicas": 2, "template": template}}


def test_a_deployment_is_paced_once_and_left_alone_after() -> None:
    change = pacing_patch(deployment(), 2.0)
    assert change is not None
    patch, what = change
    assert patch == {
        "metadata": {"annotations": {MARK: "2000M"}},
        "spec": {"template": {"metadata": {"annotations": {BW: "2000M"}}}},
    }
    assert "2000M" in what and "2 Gbps per instance" in what
    assert pacing_patch(deployment({BW: "2000M"}, "2000M"), 2.0) is None  # already paced: no write, no restart
    new_rate = pacing_patch(deployment({BW: "2000M"}, "2000M"), 2.5)  # the cap or the instances changed
    assert new_rate is not None and new_rate[0]["spec"]["template"]["metadata"]["annotations"][BW] == "2500M"
    # a hand-set limit is overwritten when pacing is on: the operator's rate is the one the gateway books
    assert pacing_patch(deployment({BW: "9000M"}), 2.0) is not None


def test_turning_pacing_off_removes_only_what_the_operator_set() -> None:
    assert pacing_patch(deployment({BW: "5000M"}), None) is None  # a person's own limit, no marker: untouched
    change = pacing_patch(deployment({BW: "2000M"}, "2000M"), None)
    assert change is not None
    assert change[0] == {
        "metadata": {"annotations": {MARK: None}},
        "spec": {"template": {"metadata": {"annotations": {BW: None}}}},
    }
    # the template's limit was changed by hand since: the marker goes, the person's limit stays
    change = pacing_patch(deployment({BW: "7000M"}, "2000M"), None)
    assert change is not None and change[0] == {"metadata": {"annotations": {MARK: None}}}


def test_a_leader_worker_set_paces_each_pod_of_an_instance() -> None:
    """A multi-node instance sends KV from each of its pods: each gets an equal part of the instance's rate."""
    lws: dict[str, Any] = {
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "prefill"},
        "spec": {"leaderWorkerTemplate": {"size": 4, "leaderTemplate": {"spec": {}}, "workerTemplate": {"spec": {}}}},
    }
    change = pacing_patch(lws, 20.0)
    assert change is not None
    lwt = change[0]["spec"]["leaderWorkerTemplate"]
    assert lwt["leaderTemplate"]["metadata"]["annotations"][BW] == "5000M"
    assert lwt["workerTemplate"]["metadata"]["annotations"][BW] == "5000M"
    assert "5000M per pod of 4" in change[1]
    del lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]  # the leader uses the worker template
    change = pacing_patch(lws, 20.0)
    assert change is not None and list(change[0]["spec"]["leaderWorkerTemplate"]) == ["workerTemplate"]
