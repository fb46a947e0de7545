"""Property tests: for random objects, the CEL rule in the CRD and its paired Python check agree."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from prfaas_core.api import InterDCLink, PDCluster, PrefillCluster
from prfaas_core.schema.check import cel_environment, check_against_crd
from prfaas_core.schema.crds import crd_schema_by_kind
from prfaas_core.schema.validation import model_issues
from support.resources import prefill_cluster_doc

SETTINGS = settings(max_examples=60, deadline=None)
cel_environment()  # raises the recursion limit once, before hypothesis starts watching it


def _verdicts(kind: str, model: Any, doc: dict[str, Any]) -> tuple[set[str], set[str]]:
    crd = {i.path for i in check_against_crd(crd_schema_by_kind()[kind], doc)}
    _, issues = model_issues(model, doc)
    return crd, {i.path for i in issues}


@SETTINGS
@given(
    cap=st.floats(min_value=-0.5, max_value=1.5, allow_nan=False),
    scarce=st.floats(min_value=0.01, max_value=1.0),
    abundant=st.floats(min_value=0.01, max_value=1.0),
    capacity=st.one_of(st.integers(min_value=-10, max_value=1000), st.floats(min_value=-10, max_value=1000)),
)
def test_link_rules_agree(cap: float, scarce: float, abundant: float, capacity: float) -> None:
    doc = {
        "apiVersion": "prfaas.io/v1alpha1",
        "kind": "InterDCLink",
        "metadata": {"name": "l"},
        "spec": {
            "prefillClusterRef": {"name": "a"},
            "pdClusterRef": {"name": "b"},
            "capacityGbps": capacity,
            "maxUtilization": cap,
            "scarceWatermark": scarce,
            "abundantWatermark": abundant,
        },
    }
    crd, model = _verdicts("InterDCLink", InterDCLink, doc)
    # the model stops at field errors before running cross-field checks, like the API server skipping CEL
    # on objects that fail the schema; so compare exactly when there are no field errors
    assert bool(crd) == bool(model), (crd, model)
    if crd and model:
        assert crd & model, (crd, model)


@SETTINGS
@given(
    instances=st.integers(min_value=1, max_value=20),
    pmin=st.integers(min_value=0, max_value=20),
    pmax=st.integers(min_value=0, max_value=20),
    dmin=st.integers(min_value=0, max_value=20),
    dmax=st.integers(min_value=0, max_value=20),
    initial=st.one_of(st.none(), st.integers(min_value=0, max_value=20)),
    mode=st.sampled_from(["Relabel", "Scale"]),
    shared=st.booleans(),
)
def test_pd_cluster_rules_agree(
    instances: int, pmin: int, pmax: int, dmin: int, dmax: int, initial: int | None, mode: str, shared: bool
) -> None:
    workload = {"kind": "Deployment", "name": "w"}
    workloads = {"shared": workload} if shared else {"prefill": workload, "decode": workload}
    assignment: dict[str, Any] = {"mode": mode}
    if initial is not None:
        assignment["initialPrefill"] = initial
    doc = {
        "apiVersion": "prfaas.io/v1alpha1",
        "kind": "PDCluster",
        "metadata": {"name": "p"},
        "spec": {
            "region": "b",
            "modelProfileRef": {"name": "m"},
            "instances": instances,
            "hardware": {"accelerator": "H20"},
            "roleAssignment": assignment,
            "workloads": workloads,
            "roles": {"prefill": {"min": pmin, "max": pmax}, "decode": {"min": dmin, "max": dmax}},
        },
    }
    crd, model = _verdicts("PDCluster", PDCluster, doc)
    assert bool(crd) == bool(model), (crd, model)
    if model:
        # pydantic stops at the first failing rule of an object; the API server reports every rule
        assert model <= crd, (crd, model)


@SETTINGS
@given(
    replicas=st.one_of(st.none(), st.integers(min_value=1, max_value=5)),
    peers=st.one_of(st.none(), st.integers(min_value=0, max_value=6)),
    paced=st.booleans(),
    pull=st.booleans(),
    instance=st.booleans(),
)
def test_prefill_cluster_link_scheduling_rules_agree(
    replicas: int | None, peers: int | None, paced: bool, pull: bool, instance: bool
) -> None:
    """Absent fields included: a rule on a field the object leaves out must not fail to evaluate (the API server
    rejects the object when a rule errors)."""
    ls: dict[str, Any] = {"link": "a-to-b", "capacityGbps": 10}
    if replicas is not None:
        ls["replicas"] = replicas
    if peers is not None:
        ls["peers"] = [f"https://gw-{i}.peers.ns.svc:8443" for i in range(peers)]
    if paced:
        ls["egressPacing"] = "PerInstance"
    if pull:
        ls["pullGbps"] = 2.5
    if instance:
        ls["instanceGbps"] = 2.5
    crd, model = _verdicts("PrefillCluster", PrefillCluster, prefill_cluster_doc(ls))
    assert bool(crd) == bool(model) and model <= crd, (crd, model)  # pydantic stops at an object's first rule
    n, r = peers or 0, replicas or 1
    bad_fields = (("pullGbps", paced and pull), ("instanceGbps", paced and instance), ("peers", n not in (0, r, r - 1)))
    assert crd == {f"spec.linkScheduling.{f}" for f, bad in bad_fields if bad}
