"""The operator's reading of a sized cluster's series (prfaas_operator.elastic_demand): the snapshot's rates and
queues into the core's demand; no series is no demand (the size holds)."""

from __future__ import annotations

from pathlib import Path

import yaml

from prfaas_core.api import PDCluster
from prfaas_core.capacity.hardware import hardware_from_spec
from prfaas_core.policy.elastic import Load, pd_demand
from prfaas_operator.elastic_demand import pd_load_demand, pd_query
from prfaas_operator.observe import ClusterMetrics, Snapshot
from prfaas_operator.registry import Entry

URL = "http://prometheus:9090"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "01-two-region"


def pd_entry() -> Entry:
    body = yaml.safe_load((EXAMPLE / "region-b" / "pd-cluster.yaml").read_text())
    body["spec"]["scaling"] = {"mode": "Operator", "minInstances": 2, "maxInstances": 16, "rateWindowSeconds": 60}
    return Entry("PDCluster", body, PDCluster.model_validate(body))


def test_pd_demand_from_the_snapshot() -> None:
    entry = pd_entry()
    key = (entry.namespace or "", entry.name)
    assert pd_query(entry, URL).window_s == 60 and pd_query(entry, URL).label == "pd_cluster"
    snap = Snapshot(0.0)
    snap.demand[("pd_cluster", *key)] = {
        "prefill": {"prompt": 30_000.0, "requests": 10.0, "generation": 0.0},
        "decode": {"prompt": 90_000.0, "requests": 30.0, "generation": 5_000.0},
    }
    snap.clusters[key] = ClusterMetrics({"prefill": 4.0, "decode": 2.0}, {}, {}, {})
    demand = pd_load_demand(entry, entry.model, snap, URL)
    assert demand is not None
    # prefill: its own role's prompt tokens and queue only (decode engines' prompt tokens are remote prefills);
    # decode: every role's generated tokens and the decode queue
    pd = entry.model
    expected, _ = pd_demand(
        Load(30_000.0, 10.0, 4.0),
        Load(generation_tokens_per_s=5_000.0, decode_waiting=2.0),
        hardware_from_spec(pd.spec.hardware),
        pd.spec.slo,
        0.8,
    )
    assert demand.instances == expected and "prefill" in demand.why and "decode" in demand.why


def test_no_series_or_a_failing_prometheus_is_no_demand() -> None:
    entry = pd_entry()
    assert pd_load_demand(entry, entry.model, None, URL) is None
    assert pd_load_demand(entry, entry.model, Snapshot(0.0), URL) is None
    failing = Snapshot(0.0, errors={URL: "Prometheus at ... failed"})
    failing.demand[("pd_cluster", entry.namespace or "", entry.name)] = {"prefill": {"prompt": 1.0}}
    assert pd_load_demand(entry, entry.model, failing, URL) is None
