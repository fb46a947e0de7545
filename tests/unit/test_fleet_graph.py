"""The fleet graph over several regions' files (``prfaas validate``, prfaas_core.schema.fleet_graph): examples/06-fleet
is valid; each rule of the graph, broken on a copy of it, is reported on the field it names."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from prfaas_core.schema.validation import Checked, Document, validate_documents

FLEET = Path(__file__).resolve().parents[2] / "examples" / "06-fleet"


def docs() -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text()) for p in sorted(FLEET.rglob("*.yaml"))]


def check(bodies: list[dict[str, Any]]) -> list[Checked]:
    return validate_documents([Document(f"doc{i}", 0, b) for i, b in enumerate(bodies)])


def find(bodies: list[dict[str, Any]], kind: str, name: str, mode: str | None = None) -> dict[str, Any]:
    return next(
        b
        for b in bodies
        if b["kind"] == kind and b["metadata"]["name"] == name and (mode is None or b["spec"].get("mode") == mode)
    )


def problems(checked: list[Checked]) -> list[tuple[str, str]]:
    return [(i.path, i.message) for c in checked for i in c.issues]


def test_the_fleet_example_is_valid_and_its_site_cap_binds() -> None:
    checked = check(docs())
    assert problems(checked) == []
    assert not [w for c in checked for w in c.warnings if w.source == "graph"]  # 10 Gbps < 160: it binds


def test_two_links_between_one_pd_cluster_and_one_site_are_refused() -> None:
    bodies = docs()
    twin = copy.deepcopy(find(bodies, "InterDCLink", "east-to-site-1"))
    twin["metadata"]["name"] = "east-to-site-1-again"
    found = problems(check([*bodies, twin]))
    assert any(p == "spec.prefillClusterRef.name" and "one link per" in m for p, m in found), found


def test_a_site_whose_view_of_a_link_disagrees_is_refused_naming_the_field() -> None:
    bodies = docs()
    find(bodies, "PrefillCluster", "site-2", "Managed")["spec"]["linkScheduling"]["links"][0]["capacityGbps"] = 50
    found = problems(check(bodies))
    assert any(p == "spec.linkScheduling.links[0].capacityGbps" and "50 here, 100 there" in m for p, m in found), found
    bodies = docs()
    find(bodies, "PrefillCluster", "site-1", "Managed")["spec"]["linkScheduling"]["maxUtilization"] = 0.5
    found = problems(check(bodies))
    assert any(p == "spec.linkScheduling.maxUtilization" for p, _ in found), found


def test_a_link_its_managed_site_does_not_schedule_is_refused() -> None:
    bodies = docs()
    ls = find(bodies, "PrefillCluster", "site-1", "Managed")["spec"]["linkScheduling"]
    ls["links"] = []
    found = problems(check(bodies))
    assert any(p == "metadata.name" and "west-to-site-1" in m and "refuse" in m for p, m in found), found


def test_a_link_scheduled_by_another_site_is_refused() -> None:
    bodies = docs()
    find(bodies, "PrefillCluster", "site-2", "Managed")["spec"]["linkScheduling"]["links"][0]["name"] = "west-to-site-1"
    found = problems(check(bodies))
    assert any(
        p == "spec.linkScheduling.links[0].name" and "sends from PrefillCluster 'site-1'" in m for p, m in found
    ), found


def test_a_site_cap_that_cannot_bind_is_a_warning_and_two_regions_must_agree_on_it() -> None:
    bodies = docs()
    for b in bodies:
        if b["kind"] == "PrefillCluster" and b["metadata"]["name"] == "site-1":
            b["spec"]["siteEgressCapGbps"] = 400
    checked = check(bodies)
    assert problems(checked) == []
    warned = [w for c in checked for w in c.warnings if w.source == "graph"]
    assert warned and all(w.path == "spec.siteEgressCapGbps" and "never bind" in w.message for w in warned)
    bodies = docs()
    find(bodies, "PrefillCluster", "site-1", "Managed")["spec"]["siteEgressCapGbps"] = 20
    found = problems(check(bodies))
    assert any(p == "spec.siteEgressCapGbps" and "same site cap" in m for p, m in found), found


def test_a_link_listed_twice_in_link_scheduling_is_refused_by_the_crd_and_the_model() -> None:
    bodies = docs()
    ls = find(bodies, "PrefillCluster", "site-1", "Managed")["spec"]["linkScheduling"]
    ls["links"].append(dict(ls["links"][0]))
    assert any(p.startswith("spec.linkScheduling.links") for p, _ in problems(check(bodies)))
    bodies = docs()
    ls = find(bodies, "PrefillCluster", "site-1", "Managed")["spec"]["linkScheduling"]
    ls["links"][0]["name"] = ls["link"]
    assert any(p == "spec.linkScheduling.links" for p, _ in problems(check(bodies)))


def test_one_regions_files_alone_still_validate_strictly() -> None:
    """A scheduled link's InterDCLink lives in another region's tree: checking one region alone reports nothing."""
    site = [
        yaml.safe_load(p.read_text())
        for p in [FLEET / "common/model-profile.yaml", FLEET / "site-1/prefill-cluster.yaml"]
    ]
    checked = check(site)
    assert problems(checked) == [] and not [u for c in checked for u in c.unresolved]
