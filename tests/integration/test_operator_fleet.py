"""A PD cluster reaching two sites, the operator as a real process against the Kubernetes API emulator: the routers
get one remote per link in the stated preference order (widest cap first); draining a link takes its remote out
(its link stays, for the prefills in flight) and draining the site takes out the other; every link and the sites
report Drained with an Event, and a site reports its links and whether its egress cap binds."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from prfaas_operator.router_config import CONFIG_KEY, configmap_name
from prfaas_testbed.operator_harness import Harness
from prfaas_testbed.prom import wait_until

pytestmark = pytest.mark.timeout(180)

SITE_1, LINK_1 = "prfaas-h200", "a-to-b"  # the harness' pair
SITE_2, LINK_2 = "site-2", "site-2-to-b"  # the second site: a wider link (200 Gbps), a 100 Gbps site cap


def remotes(h: Harness, ns: str) -> tuple[list[str], list[str]] | None:
    cm = h.get("ConfigMap", ns, configmap_name("pd-h20"))
    if cm is None:
        return None
    config = json.loads(cm["data"][CONFIG_KEY])
    return [r["link"] for r in config.get("remotes") or []], sorted(x["name"] for x in config.get("links") or [])


def condition(h: Harness, ns: str, name: str, kind: str, type_: str) -> dict[str, Any]:
    return next((c for c in h.status(ns, name, kind).get("conditions") or [] if c["type"] == type_), {})


def reasons(h: Harness, ns: str, name: str) -> set[str]:
    return {e["reason"] for e in h.events(ns) if e["involvedObject"]["name"] == name}


def test_a_pd_cluster_reaching_two_sites_and_their_drains(h: Harness) -> None:
    ns = h.namespace()
    op = h.start_operator(ns)
    h.setup(ns)
    docs = h.manifests(ns)
    site = copy.deepcopy(next(d for d in docs if d["kind"] == "PrefillCluster"))
    site["metadata"]["name"] = SITE_2
    site["spec"]["siteEgressCapGbps"] = 100
    h.create(site)
    link = copy.deepcopy(next(d for d in docs if d["kind"] == "InterDCLink"))
    link["metadata"]["name"] = LINK_2
    link["spec"].update(prefillClusterRef={"name": SITE_2}, capacityGbps=200)
    h.create(link)

    # one remote per link, widest cap first (160 Gbps before 80), both links
    both = sorted([LINK_1, LINK_2])
    wait_until(lambda: remotes(h, ns) == ([LINK_2, LINK_1], both), 60, "both remotes, the wider link first")
    # the site's status: its link here, and its 100 Gbps cap binding under the link's 160
    st = wait_until(lambda: h.status(ns, SITE_2, "PrefillCluster").get("siteCap"), 30, "the site cap reported")
    assert st == {"capGbps": 100, "linksCapGbps": 160, "binds": True}
    assert h.status(ns, SITE_2, "PrefillCluster")["links"] == [
        {"name": LINK_2, "pdCluster": "pd-h20", "capGbps": 160, "drained": False}
    ]
    assert condition(h, ns, SITE_2, "PrefillCluster", "SiteCapBinding")["status"] == "True"
    assert condition(h, ns, LINK_2, "InterDCLink", "Drained")["status"] == "False"

    # drain the wider link: its remote goes, its link stays (in-flight prefills finish over it)
    h.patch("InterDCLink", ns, LINK_2, {"spec": {"drained": True}})
    wait_until(lambda: remotes(h, ns) == ([LINK_1], both), 60, "the drained link's remote out")
    wait_until(lambda: condition(h, ns, LINK_2, "InterDCLink", "Drained").get("status") == "True", 30, "Drained")
    wait_until(lambda: "LinkDrained" in reasons(h, ns, LINK_2), 30, "the LinkDrained Event")
    # the site's only link drained: its cap no longer binds (an Event says so)
    wait_until(lambda: condition(h, ns, SITE_2, "PrefillCluster", "SiteCapBinding").get("status") == "False", 30, "")
    assert h.status(ns, SITE_2, "PrefillCluster")["siteCap"]["binds"] is False
    wait_until(lambda: "SiteCapSlack" in reasons(h, ns, SITE_2), 30, "the SiteCapSlack Event")

    # drain the other site: no remote is left, the routers prefill locally; both links are still listed
    h.patch("PrefillCluster", ns, SITE_1, {"spec": {"drained": True}})
    wait_until(lambda: remotes(h, ns) == ([], both), 60, "no remote left")
    wait_until(lambda: condition(h, ns, SITE_1, "PrefillCluster", "Drained").get("status") == "True", 30, "Drained")
    wait_until(lambda: "Drained" in reasons(h, ns, SITE_1), 30, "the site's Drained Event")
    cond = wait_until(
        lambda: (c := condition(h, ns, LINK_1, "InterDCLink", "Drained")).get("status") == "True" and c, 30, "link"
    )
    assert SITE_1 in cond["message"]  # drained by its site, not by itself

    # back in service: the remotes return in the same order
    h.patch("PrefillCluster", ns, SITE_1, {"spec": {"drained": False}})
    h.patch("InterDCLink", ns, LINK_2, {"spec": {"drained": False}})
    wait_until(lambda: remotes(h, ns) == ([LINK_2, LINK_1], both), 60, "both remotes back")
    wait_until(lambda: "Undrained" in reasons(h, ns, SITE_1), 30, "the Undrained Event")
    op.stop()
