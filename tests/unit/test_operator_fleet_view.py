"""The operator's view of a fleet (prfaas_operator.fleet): a site's links and cap, and what bounds its sizing."""

from __future__ import annotations

from pathlib import Path

import yaml

from prfaas_core.api import InterDCLink, PrefillCluster
from prfaas_operator.fleet import egress_bound_gbps, site_cap, site_links

FLEET = Path(__file__).parents[2] / "examples/06-fleet"


def load(rel: str) -> dict:  # type: ignore[type-arg]
    return dict(yaml.safe_load((FLEET / rel).read_text()))


def test_a_site_bounds_its_sizing_by_its_links_under_its_cap() -> None:
    site_1 = load("site-1/prefill-cluster.yaml")  # two links of 80 Gbps cap, a 10 Gbps site cap
    assert egress_bound_gbps(PrefillCluster.model_validate(site_1)) == 10
    del site_1["spec"]["siteEgressCapGbps"]
    assert egress_bound_gbps(PrefillCluster.model_validate(site_1)) == 160
    del site_1["spec"]["linkScheduling"]
    assert egress_bound_gbps(PrefillCluster.model_validate(site_1)) is None


def test_a_site_lists_its_links_known_here_and_whether_its_cap_binds() -> None:
    managed = PrefillCluster.model_validate(load("site-1/prefill-cluster.yaml"))
    links = site_links(managed, [])
    assert [(x.name, x.cap_gbps, x.pd_cluster) for x in links] == [
        ("east-to-site-1", 80, None),
        ("west-to-site-1", 80, None),
    ]
    cap = site_cap(managed, links)
    assert cap is not None and (cap.cap_gbps, cap.links_cap_gbps, cap.binds) == (10, 160, True)
    remote = PrefillCluster.model_validate(load("region-east/prefill-cluster-site-1.yaml"))
    link = load("region-east/inter-dc-link-site-1.yaml")
    link["spec"]["drained"] = True
    links = site_links(remote, [InterDCLink.model_validate(link)])
    assert [(x.name, x.pd_cluster, x.drained) for x in links] == [("east-to-site-1", "pd-east", True)]
    cap = site_cap(remote, links)
    assert cap is not None and (cap.links_cap_gbps, cap.binds) == (0, False)  # a drained link shares nothing
