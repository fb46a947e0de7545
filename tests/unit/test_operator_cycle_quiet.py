"""The cycle's idle ticks (issue 45): a tick (one a second) that finds nothing due remembers when the first object
is next due, and until then answers "nothing due" without a look over the whole fleet — the same answer the look
gives, as long as no object changed and nothing was reconciled."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from prfaas_core.names import KIND_INTER_DC_LINK, KIND_PD_CLUSTER, KIND_PREFILL_CLUSTER
from prfaas_operator.config import OperatorConfig
from prfaas_operator.cycle import Cycle, Due
from prfaas_operator.kube import KubeCredentials
from prfaas_operator.runner import build

FLEET = Path(__file__).parents[2] / "examples/06-fleet"


@pytest.fixture
def cycle(tmp_path: Path) -> Iterator[Cycle]:
    kubeconfig = tmp_path / "kubeconfig"  # nothing is asked of the API here
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: c\n  cluster: {server: 'http://127.0.0.1:9'}\n"
        "users:\n- name: u\n  user: {token: t}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\n"
    )
    op = build(OperatorConfig(all_namespaces=True, metrics_port=None), KubeCredentials.load(str(kubeconfig)))
    docs = [yaml.safe_load(p.read_text()) for p in sorted((FLEET / "region-east").glob("*.yaml"))]
    docs.append(yaml.safe_load((FLEET / "common/model-profile.yaml").read_text()))
    for doc in docs:
        assert op.world.upsert(doc["kind"], doc).valid
    try:
        yield op.cycle
    finally:
        asyncio.run(op.api.aclose())


def _looked(cycle: Cycle, now_s: float) -> Due:
    """What a look over every object finds (the remembered quiet time left as it was)."""
    quiet, cycle._quiet = cycle._quiet, None
    try:
        return cycle._due(now_s)
    finally:
        cycle._quiet = quiet


def _keys(due: Due) -> tuple[set, set, set]:  # type: ignore[type-arg]
    return due.pfc, due.link, due.pd


def test_idle_ticks_answer_as_the_look_over_the_fleet_does_until_something_changes(cycle: Cycle) -> None:
    w = cycle.world
    pfcs = [e.key for e in w.all(KIND_PREFILL_CLUSTER)]
    links = [e.key for e in w.all(KIND_INTER_DC_LINK)]
    (pd,) = w.all(KIND_PD_CLUSTER)
    assert len(pfcs) == len(links) == 2
    assert cycle._due(0.0).any and cycle._quiet is None  # never run: everything is due
    for key in pfcs:
        cycle.prefill.next_due[key] = 100.0
    cycle.link.next_due[links[0]], cycle.link.next_due[links[1]] = 90.0, 130.0
    cycle.pd.runtime(pd).next_due_s = 95.0
    for now_s in (10.0, 50.0, 89.0, 89.9):
        assert not cycle._due(now_s).any and _keys(cycle._due(now_s)) == _keys(_looked(cycle, now_s))
        assert cycle._quiet == (w.version, 90.0)  # the earliest: a link
    due = cycle._due(90.0)  # the quiet time reached: looked again
    assert _keys(due) == _keys(_looked(cycle, 90.0)) and due.link == {links[0]} and cycle._quiet is None
    cycle.link.next_due[links[0]] = 120.0  # (as a reconcile sets it)
    assert not cycle._due(91.0).any and cycle._quiet == (w.version, 95.0)  # the PD cluster next
    # a changed object: looked at again at once (here a new PrefillCluster, due at once)
    site = w.get(KIND_PREFILL_CLUSTER, *pfcs[0])
    assert site is not None
    body = {**site.body}
    body["metadata"] = {**body["metadata"], "name": "site-3"}
    new = w.upsert(KIND_PREFILL_CLUSTER, body).key
    due = cycle._due(92.0)
    assert due.pfc == {new} and _keys(due) == _keys(_looked(cycle, 92.0))
    cycle.prefill.next_due[new] = 200.0
    assert not cycle._due(93.0).any and cycle._quiet == (w.version, 95.0)
    # a paused PD cluster runs no loop: the next is the first PrefillClusters' period
    paused = {**pd.body, "metadata": {**pd.body["metadata"], "annotations": {"prfaas.io/paused": "true"}}}
    w.upsert(KIND_PD_CLUSTER, paused)
    for now_s in (94.0, 96.0, 99.0):
        assert not cycle._due(now_s).any and _keys(cycle._due(now_s)) == _keys(_looked(cycle, now_s))
    assert cycle._quiet == (w.version, 100.0)
    assert cycle._due(100.0).pfc == set(pfcs) == _looked(cycle, 100.0).pfc
