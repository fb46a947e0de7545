"""A fleet as this region's operator sees it: the order in which a PD cluster's routers prefer its sites, which links
are drained, and each site's links and egress cap (PrefillCluster status).

**Preference order** of a PD cluster's remotes (``RouterConfig.remotes``: the routers use the first ready one where
they choose by order): links in service first; among them the widest cap first (``capacityGbps x maxUtilization``:
the site that can take the most KV), then the shortest round trip (``rttMs``), then the link's name, so the order
is total and stable. A drained link, or a link to a drained site, has no remote (no new remote prefill crosses it)
but stays among the routers' links, so the prefills in flight over it finish and are counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from prfaas_core.api import (
    Condition,
    InterDCLink,
    PrefillCluster,
    SiteCapStatus,
    SiteLinkStatus,
)

from .status import set_condition


def link_cap_gbps(link: InterDCLink) -> float:
    return link.spec.capacity_gbps * link.spec.max_utilization


def link_drained(link: InterDCLink, site: PrefillCluster | None) -> bool:
    """Drained on purpose: the link itself, or the site it leaves from."""
    return link.spec.drained or (site is not None and site.spec.drained)


def preference(link: InterDCLink, site: PrefillCluster | None) -> tuple[bool, float, float, str]:
    """Sort key of a PD cluster's links: in service, widest cap, shortest RTT, name."""
    return (link_drained(link, site), -link_cap_gbps(link), link.spec.rtt_ms, link.metadata.name)


def ordered(links: Iterable[InterDCLink], sites: Mapping[str, PrefillCluster]) -> list[InterDCLink]:
    return sorted(links, key=lambda x: preference(x, sites.get(x.spec.prefill_cluster_ref.name)))


def site_links(site: PrefillCluster, links_here: Sequence[InterDCLink]) -> list[SiteLinkStatus]:
    """The site's links known in this region: those its ``linkScheduling`` schedules (Managed) and the
    InterDCLinks that name it here (the decoding region's), by name."""
    out: dict[str, SiteLinkStatus] = {}
    ls = site.spec.link_scheduling
    if ls is not None:
        for sl in ls.all_links():
            out[sl.name] = SiteLinkStatus(
                name=sl.name, cap_gbps=round(sl.capacity_gbps * sl.max_utilization, 6), drained=site.spec.drained
            )
    for link in links_here:
        if link.spec.prefill_cluster_ref.name != site.metadata.name:
            continue
        out[link.metadata.name] = SiteLinkStatus(
            name=link.metadata.name,
            pd_cluster=link.spec.pd_cluster_ref.name,
            cap_gbps=round(link_cap_gbps(link), 6),
            drained=link_drained(link, site),
        )
    return [out[k] for k in sorted(out)]


def egress_bound_gbps(site: PrefillCluster) -> float | None:
    """What a Managed site's KV may use in all (elastic sizing's bound): the sum of the caps of the links it
    schedules, under its site cap; None where it schedules none."""
    ls = site.spec.link_scheduling
    if ls is None:
        return None
    total = sum(sl.capacity_gbps * sl.max_utilization for sl in ls.all_links())
    cap = site.spec.site_egress_cap_gbps
    return total if cap is None else min(total, cap)


def site_cap(site: PrefillCluster, links: Sequence[SiteLinkStatus]) -> SiteCapStatus | None:
    cap = site.spec.site_egress_cap_gbps
    if cap is None:
        return None
    total = round(sum(x.cap_gbps for x in links if not x.drained), 6)
    return SiteCapStatus(cap_gbps=cap, links_cap_gbps=total, binds=total > cap)


def site_conditions(
    conds: Sequence[Condition],
    site: PrefillCluster,
    links: Sequence[SiteLinkStatus],
    cap: SiteCapStatus | None,
    now_s: float,
    generation: int | None,
) -> tuple[list[Condition], list[tuple[str, str]]]:
    """The site's Drained and SiteCapBinding conditions, and the Events (reason, message) their changes raise."""
    events: list[tuple[str, str]] = []
    out = list(conds)
    old = {c.type: c.status for c in conds}
    drained_links = [x.name for x in links if x.drained]
    if site.spec.drained:
        message = "spec.drained: no new remote prefill is sent here; the ones in flight finish"
        out = set_condition(out, "Drained", True, "DrainedForMaintenance", message, now_s, generation)
    else:
        message = "in service" + (f"; drained links: {', '.join(drained_links)}" if drained_links else "")
        out = set_condition(out, "Drained", False, "InService", message, now_s, generation)
    now = "True" if site.spec.drained else "False"
    if old.get("Drained", "False") != now:
        events.append(("Drained" if site.spec.drained else "Undrained", message))
    if cap is not None:
        message = (
            f"site cap {cap.cap_gbps:g} Gbps against {cap.links_cap_gbps:g} Gbps of its links' caps in service"
            + (": the links share it" if cap.binds else ": it does not bind")
        )
        reason = "LinksExceedSiteCap" if cap.binds else "SiteCapAboveLinks"
        out = set_condition(out, "SiteCapBinding", cap.binds, reason, message, now_s, generation)
        if old.get("SiteCapBinding") not in (None, "True" if cap.binds else "False"):
            events.append(("SiteCapBinding" if cap.binds else "SiteCapSlack", message))
    else:
        out = [c for c in out if c.type != "SiteCapBinding"]
    return out, events


def link_condition(
    conds: Sequence[Condition], link: InterDCLink, site: PrefillCluster | None, now_s: float, generation: int | None
) -> tuple[list[Condition], tuple[str, str] | None]:
    """A link's Drained condition, and the Event its change raises."""
    drained = link_drained(link, site)
    if link.spec.drained:
        why = "spec.drained: its PD cluster's routers send no new remote prefill over it; in-flight ones finish"
    elif drained:
        why = f"its site, PrefillCluster {link.spec.prefill_cluster_ref.name}, is drained"
    else:
        why = "in service"
    old = next((c for c in conds if c.type == "Drained"), None)
    out = set_condition(
        conds, "Drained", drained, "DrainedForMaintenance" if drained else "InService", why, now_s, generation
    )
    changed = (old.status if old is not None else "False") != ("True" if drained else "False")
    return out, ((("LinkDrained" if drained else "LinkUndrained"), why) if changed else None)
