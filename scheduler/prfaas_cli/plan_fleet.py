"""``prfaas plan`` on a fleet: the manifests of several PD clusters, sites and links (every region's files at once,
e.g. examples/06-fleet), planned together by :func:`prfaas_core.capacity.fleet.plan_fleet`. ``--demand NAME=RPS``
(repeatable) gives a PD cluster's demand, requests/s; a PD cluster not named has demand 1, so without any the plan
says how many requests/s each PD cluster can take at once."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from prfaas_core.api import InterDCLink, ModelProfile, PDCluster, PrefillCluster
from prfaas_core.capacity.fleet import Fleet, FleetLink, FleetPlan, FleetRegion, FleetSite, plan_fleet
from prfaas_core.capacity.hardware import hardware_from_spec
from prfaas_core.capacity.plan_inputs import plan_inputs_from_specs
from prfaas_core.capacity.workload import WorkloadSpec
from prfaas_core.schema.validation import Checked

from .output import UsageError


class FleetInputError(Exception):
    """Manifests that cannot be planned as a fleet; the message names the object and field."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--demand",
        action="append",
        default=[],
        metavar="PD=RPS",
        help="a fleet's demand at one PD cluster, requests/s (repeatable; default 1 each)",
    )


def models(checked: list[Checked]) -> list[BaseModel]:
    return [c.model for c in checked if c.skipped is None and c.model is not None]


def is_fleet(found: list[BaseModel]) -> bool:
    """More than one PD cluster, link or site among the manifests."""
    pds = {m.metadata.name for m in found if isinstance(m, PDCluster)}
    links = {m.metadata.name for m in found if isinstance(m, InterDCLink)}
    sites = {m.metadata.name for m in found if isinstance(m, PrefillCluster)}
    return max(len(pds), len(links), len(sites)) > 1


def _demand(args: argparse.Namespace, names: set[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in args.demand:
        name, sep, value = item.partition("=")
        try:
            rate = float(value)
        except ValueError:
            rate = math.nan
        if not sep or not (rate >= 0 and math.isfinite(rate)):
            raise UsageError(f"--demand {item!r}: write PD=RPS, a PD cluster's name and requests/s >= 0")
        if name not in names:
            raise UsageError(f"--demand {item!r}: no PDCluster {name!r} among the files ({', '.join(sorted(names))})")
        out[name] = rate
    return out


def build_fleet(found: list[BaseModel], workload: WorkloadSpec, args: argparse.Namespace) -> Fleet:
    profiles = [m for m in found if isinstance(m, ModelProfile)]
    if len(profiles) != 1:
        raise FleetInputError(f"a fleet serves one model: need exactly one ModelProfile, found {len(profiles)}")
    profile = profiles[0].spec
    sites: dict[str, PrefillCluster] = {}
    drained: set[str] = set()
    for m in found:
        if isinstance(m, PrefillCluster):
            if m.metadata.name not in sites or m.spec.mode == "Managed":  # the region that runs it knows it best
                sites[m.metadata.name] = m
            if m.spec.drained:
                drained.add(m.metadata.name)
    pds = {m.metadata.name: m for m in found if isinstance(m, PDCluster)}
    links = [m for m in found if isinstance(m, InterDCLink)]
    if not pds or not sites:
        raise FleetInputError(f"a fleet needs PDClusters and PrefillClusters: found {len(pds)} and {len(sites)}")
    demand = _demand(args, set(pds))
    fleet_sites = tuple(
        FleetSite(
            name,
            hardware_from_spec(s.spec.hardware, f"PrefillCluster {name} spec.hardware"),
            s.spec.instances,
            s.spec.site_egress_cap_gbps,
            name in drained,
        )
        for name, s in sorted(sites.items())
    )
    regions = []
    for name, pd in sorted(pds.items()):
        mine = [link for link in links if link.spec.pd_cluster_ref.name == name]
        link = mine[0] if mine else None
        site = (
            sites[link.spec.prefill_cluster_ref.name] if link and link.spec.prefill_cluster_ref.name in sites else None
        )
        site = site or next(iter(sites.values()))
        if link is None:
            raise FleetInputError(f"PDCluster {name}: no InterDCLink names it in pdClusterRef (it reaches no site)")
        try:
            inputs = plan_inputs_from_specs(profile, site.spec, pd.spec, link.spec, workload)
        except ValueError as exc:
            raise FleetInputError(f"PDCluster {name}: {exc}") from None
        regions.append(FleetRegion(name, inputs, demand.get(name, 1.0)))
    fleet_links = []
    for link in sorted(links, key=lambda x: x.metadata.name):
        site_name = link.spec.prefill_cluster_ref.name
        if site_name not in sites or link.spec.pd_cluster_ref.name not in pds:
            raise FleetInputError(
                f"InterDCLink {link.metadata.name}: its ends ({link.spec.pd_cluster_ref.name}, {site_name}) are not "
                "both among the files"
            )
        cap = link.spec.capacity_gbps * link.spec.max_utilization
        fleet_links.append(
            FleetLink(link.metadata.name, link.spec.pd_cluster_ref.name, site_name, cap, link.spec.drained)
        )
    try:
        return Fleet(fleet_sites, tuple(regions), tuple(fleet_links))
    except ValueError as exc:
        raise FleetInputError(str(exc)) from None


def solve(found: list[BaseModel], workload: WorkloadSpec, args: argparse.Namespace) -> FleetPlan:
    fleet = build_fleet(found, workload, args)
    try:
        return plan_fleet(fleet)
    except ValueError as exc:
        raise FleetInputError(str(exc)) from None


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, digits)


def to_dict(result: FleetPlan) -> dict[str, Any]:
    return {
        "multiplier": _r(result.multiplier),
        "fleet_rps": _r(result.fleet_rps),
        "demand_fits": result.multiplier >= 1.0,
        "pd_clusters": [
            {
                "name": r.name,
                "rate_rps": _r(r.rate_rps),
                "threshold_tokens": round(r.threshold_tokens),
                "n_prefill": r.n_prefill,
                "n_decode": r.n_decode,
                "offload_fraction": _r(r.offload_fraction),
                "local_prefill_utilization": _r(r.local_prefill_utilization),
                "decode_utilization": _r(r.decode_utilization),
            }
            for r in result.regions
        ],
        "links": [
            {
                "name": x.name,
                "pd_cluster": x.pd_cluster,
                "site": x.site,
                "threshold_tokens": round(x.threshold_tokens),
                "rate_rps": _r(x.rate_rps),
                "egress_gbps": _r(x.egress_gbps),
                "cap_gbps": _r(x.cap_gbps),
                "utilization": _r(x.utilization),
                "drained": x.drained,
            }
            for x in result.links
        ],
        "sites": [
            {
                "name": s.name,
                "rate_rps": _r(s.rate_rps),
                "busy_instances": _r(s.busy_instances),
                "instances": s.instances,
                "egress_gbps": _r(s.egress_gbps),
                "site_cap_gbps": s.site_cap_gbps,
                "site_cap_utilization": _r(s.cap_utilization),
                "drained": s.drained,
            }
            for s in result.sites
        ],
        "binding": list(result.binding),
        "added_capacity": [
            {"resource": g.resource, "added": g.added, "fleet_rps_gain": _r(g.fleet_rps_gain)} for g in result.gains
        ],
    }


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[j]) for j, cell in enumerate(row)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def render(result: FleetPlan) -> str:
    fits = "the declared demand fits" if result.multiplier >= 1.0 else "the declared demand does NOT fit"
    lines = [
        f"Fleet: every PD cluster's demand x {result.multiplier:.3f} at once ({result.fleet_rps:.2f} req/s in all; "
        f"{fits})",
        "",
    ]
    lines += _table(
        [("PD cluster", "req/s", "t (tokens)", "N_p / N_d", "offload p", "PD-P util", "decode util")]
        + [
            (
                r.name,
                f"{r.rate_rps:.2f}",
                f"{r.threshold_tokens:.0f}",
                f"{r.n_prefill} / {r.n_decode}",
                f"{r.offload_fraction:.1%}",
                f"{r.local_prefill_utilization:.0%}",
                f"{r.decode_utilization:.0%}",
            )
            for r in result.regions
        ]
    )
    lines.append("")
    lines += _table(
        [("Link", "PD cluster -> site", "t (tokens)", "req/s", "Gbps", "cap Gbps", "util")]
        + [
            (
                x.name,
                f"{x.pd_cluster} -> {x.site}",
                f"{x.threshold_tokens:.0f}",
                f"{x.rate_rps:.2f}",
                f"{x.egress_gbps:.1f}",
                f"{x.cap_gbps:g}" + (" (drained)" if x.drained else ""),
                f"{x.utilization:.0%}",
            )
            for x in result.links
        ]
    )
    lines.append("")
    lines += _table(
        [("Site", "req/s", "busy / instances", "egress Gbps", "site cap Gbps", "cap util")]
        + [
            (
                s.name + (" (drained)" if s.drained else ""),
                f"{s.rate_rps:.2f}",
                f"{s.busy_instances:.2f} / {s.instances}",
                f"{s.egress_gbps:.1f}",
                f"{s.site_cap_gbps:g}" if s.site_cap_gbps is not None else "—",
                f"{s.cap_utilization:.0%}" if s.cap_utilization is not None else "—",
            )
            for s in result.sites
        ]
    )
    lines += ["", "Binds: " + ("; ".join(result.binding) if result.binding else "nothing (demand-bound)") + "."]
    if result.gains:
        lines += ["", "Where added capacity pays most (fleet req/s at the same demand mix):"]
        lines += _table(
            [("Resource", "Added", "Gain req/s")]
            + [(g.resource, g.added, f"{g.fleet_rps_gain:+.3f}") for g in result.gains]
        )
    return "\n".join(lines)
