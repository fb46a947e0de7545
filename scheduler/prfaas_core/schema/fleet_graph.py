"""Checks of the fleet graph (``prfaas validate``): PD clusters, sites (PrefillClusters) and the links between
them, over the files of one region or of several at once. Pure.

A link (InterDCLink) lives in its decoding region and names both ends; the site's own region repeats each link it
schedules in the Managed PrefillCluster's ``linkScheduling`` (``link`` and ``links``). Errors:

- two links joining the same PD cluster and site (the routers keep one remote per site: one link per pair);
- a link the Managed site schedules whose InterDCLink (among the files) sends from another PrefillCluster, or
  whose capacity or cap differs there (the gateway would book another link than the routers measure; at run time
  the gateway refuses such a router with a 400 naming the field);
- an InterDCLink to a Managed site (among the files) that schedules its links but not this one (its gateway would
  refuse every prefill on it);
- two descriptions of one site (the Managed one and a Remote one in another region) with different
  ``siteEgressCapGbps``.

Warning: a ``siteEgressCapGbps`` at or above the sum of its links' caps. It can never bind, which is consistent
(links may be added later, and the cap then starts to matter) but more often a stale or mistyped figure; an error
would refuse a working configuration.

A scheduled link whose InterDCLink is not among the files is not reported: it lives in another region's tree, and
each region's tree is checked alone too (``--strict-references`` on one region must pass).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..api.base import ApiModel
from ..api.inter_dc_link import InterDCLink
from ..api.prefill_cluster import PrefillCluster
from .check import Issue

Found = dict[int, list[Issue]]


@dataclass(frozen=True)
class SiteLink:
    """A link of a site, as either end declares it: where, its name and its cap."""

    index: int
    path: str
    name: str
    capacity_gbps: float
    max_utilization: float

    @property
    def cap_gbps(self) -> float:
        return self.capacity_gbps * self.max_utilization


def _scheduled(pfc: PrefillCluster, index: int) -> list[SiteLink]:
    ls = pfc.spec.link_scheduling
    if ls is None:
        return []
    out = [SiteLink(index, "spec.linkScheduling", ls.link, ls.capacity_gbps, ls.max_utilization)]
    for j, extra in enumerate(ls.links):
        path = f"spec.linkScheduling.links[{j}]"
        out.append(SiteLink(index, path, extra.name, extra.capacity_gbps, extra.max_utilization))
    return out


def _link_field(sl: SiteLink, field: str) -> str:
    return f"{sl.path}.link" if field == "name" and sl.path == "spec.linkScheduling" else f"{sl.path}.{field}"


def graph_issues(models: Sequence[ApiModel | None], default_namespace: str = "default") -> tuple[Found, Found]:
    """(errors, warnings) by position in ``models`` (None: an object the models rejected, skipped here)."""
    errors: Found = {}
    warnings: Found = {}
    links = [(i, m) for i, m in enumerate(models) if isinstance(m, InterDCLink)]
    sites = [(i, m) for i, m in enumerate(models) if isinstance(m, PrefillCluster)]

    pairs: dict[tuple[str, str, str], str] = {}
    for i, link in links:
        ns = link.metadata.namespace or default_namespace
        pair = (ns, link.spec.pd_cluster_ref.name, link.spec.prefill_cluster_ref.name)
        if pair in pairs:
            errors.setdefault(i, []).append(
                Issue(
                    "spec.prefillClusterRef.name",
                    f"InterDCLink {pairs[pair]!r} already joins PDCluster {pair[1]!r} to PrefillCluster {pair[2]!r}: "
                    "one link per (PD cluster, PrefillCluster) pair",
                    "graph",
                )
            )
        else:
            pairs[pair] = link.metadata.name

    by_name: dict[str, list[tuple[int, InterDCLink]]] = {}
    for i, link in links:
        by_name.setdefault(link.metadata.name, []).append((i, link))
    managed = {s.metadata.name: (i, s) for i, s in sites if s.spec.mode == "Managed"}

    for name, (i, site) in managed.items():
        for sl in _scheduled(site, i):
            for _, link in by_name.get(sl.name, []):
                sender = link.spec.prefill_cluster_ref.name
                if sender != name:
                    errors.setdefault(i, []).append(
                        Issue(
                            _link_field(sl, "name"),
                            f"InterDCLink {sl.name!r} sends from PrefillCluster {sender!r}, not {name!r}",
                            "graph",
                        )
                    )
                    continue
                for field, here, there in (
                    ("capacityGbps", sl.capacity_gbps, link.spec.capacity_gbps),
                    ("maxUtilization", sl.max_utilization, link.spec.max_utilization),
                ):
                    if here != there:
                        errors.setdefault(i, []).append(
                            Issue(
                                _link_field(sl, field),
                                f"the gateway's view of link {sl.name!r} disagrees with its InterDCLink: {field} "
                                f"{here:g} here, {there:g} there",
                                "graph",
                            )
                        )
    for i, link in links:
        sender = link.spec.prefill_cluster_ref.name
        if sender not in managed:
            continue
        si, site = managed[sender]
        scheduled = {sl.name for sl in _scheduled(site, si)}
        if scheduled and link.metadata.name not in scheduled:
            errors.setdefault(i, []).append(
                Issue(
                    "metadata.name",
                    f"PrefillCluster {sender!r} schedules links {sorted(scheduled)} in its linkScheduling but not "
                    f"{link.metadata.name!r}: its gateway would refuse every prefill on this link",
                    "graph",
                )
            )

    caps = {s.metadata.name: s.spec.site_egress_cap_gbps for _, s in sites if s.spec.mode == "Managed"}
    for i, site in sites:
        cap = site.spec.site_egress_cap_gbps
        name = site.metadata.name
        if site.spec.mode == "Remote" and name in caps and caps[name] != cap:
            errors.setdefault(i, []).append(
                Issue(
                    "spec.siteEgressCapGbps",
                    f"the Managed PrefillCluster {name!r} says {caps[name]}, this description {cap}: both regions "
                    "must hold the same site cap",
                    "graph",
                )
            )
        if cap is None:
            continue
        link_caps = {sl.name: sl.cap_gbps for sl in _scheduled(site, i)}
        for _, link in links:
            if link.spec.prefill_cluster_ref.name == name:
                link_caps[link.metadata.name] = link.spec.capacity_gbps * link.spec.max_utilization
        total = sum(link_caps.values())
        if link_caps and cap >= total:
            warnings.setdefault(i, []).append(
                Issue(
                    "spec.siteEgressCapGbps",
                    f"{cap:g} Gbps is at or above the sum of its {len(link_caps)} link(s)' caps ({total:g} Gbps): "
                    "it can never bind",
                    "graph",
                )
            )
    return errors, warnings
