"""Fleet planning: several PrFaaS sites serving several PD clusters (regions) over one link per (PD cluster, site)
pair, each link under its own cap and each site's links together under the site's egress cap.

The throughput model is the planner's (:mod:`prfaas_core.capacity.throughput`, paper Eqs. 2–6), per PD cluster:
at threshold ``t`` a fraction ``p(t)`` of its requests is long (mean ``l_long``, KV ``S̄_kv``); its own prefill
instances carry the short ones (``Λ(1 − p)·T_pdp(l_short) <= N_p``), its decode instances all of them
(``Λ <= N_d·Θ_d``); the long ones go to the sites it reaches, each request costing a site ``T_prf(l_long)``
instance-seconds and ``S̄_kv`` bytes on its link and on the site's egress.

The question asked is the one the fleet's goodput asks: the highest common multiplier ``α`` of every region's
demand that the fleet carries at once. At a given ``α`` each PD cluster keeps as few decode instances as its
decode needs and prefills locally as much as the rest can (the highest ``t`` it bears): every remote resource a
region uses falls as its ``t`` rises, so that choice leaves the most room to the others. What is left long is
routed by a linear program over the links (per link: its cap; per site: its instances and its egress cap);
``α`` is found by bisection. Drained links and sites carry nothing.

Where to add capacity: the plan is solved again with one more instance at each site and PD cluster and 10 Gbps
more cap on each link and site cap, and reports the gain in fleet requests per second — the same instance-counted
capacity elastic scaling sizes clusters by (:mod:`prfaas_core.policy.elastic`), asked what the next one buys.
Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ..names import GBPS_BITS
from .hardware import HardwareProfile
from .lp import maximize
from .plan_inputs import PlanInputs
from .throughput import LengthSplit, split_lengths, threshold_grid

ADD_GBPS = 10.0
"""The cap added to one link or site cap when asking where capacity pays most."""
BINDS_AT = 0.99
"""A resource used to this fraction of its bound at the plan's ``α`` binds."""


@dataclass(frozen=True)
class FleetSite:
    name: str
    hardware: HardwareProfile
    instances: int
    site_cap_gbps: float | None = None
    drained: bool = False


@dataclass(frozen=True)
class FleetRegion:
    """A PD cluster with its plan inputs (its hardware, instances, roles' bounds, workload) and its demand."""

    name: str
    inputs: PlanInputs
    demand_rps: float


@dataclass(frozen=True)
class FleetLink:
    name: str
    pd_cluster: str
    site: str
    cap_gbps: float
    drained: bool = False


@dataclass(frozen=True)
class Fleet:
    sites: tuple[FleetSite, ...]
    regions: tuple[FleetRegion, ...]
    links: tuple[FleetLink, ...]

    def __post_init__(self) -> None:
        sites, regions = {s.name for s in self.sites}, {r.name for r in self.regions}
        pairs = set()
        for link in self.links:
            if link.site not in sites or link.pd_cluster not in regions:
                raise ValueError(f"link {link.name}: joins {link.pd_cluster!r} to {link.site!r}, not both in the fleet")
            if (link.pd_cluster, link.site) in pairs:
                raise ValueError(f"link {link.name}: a second link between {link.pd_cluster!r} and {link.site!r}")
            pairs.add((link.pd_cluster, link.site))
        if (
            not self.regions
            or any(r.demand_rps < 0 for r in self.regions)
            or sum(r.demand_rps for r in self.regions) <= 0
        ):
            raise ValueError("the fleet needs at least one PD cluster and a positive demand")


@dataclass(frozen=True)
class RegionPlan:
    name: str
    rate_rps: float
    threshold_tokens: float
    n_prefill: int
    n_decode: int
    offload_fraction: float
    local_prefill_utilization: float
    decode_utilization: float


@dataclass(frozen=True)
class LinkPlan:
    name: str
    pd_cluster: str
    site: str
    rate_rps: float
    egress_gbps: float
    cap_gbps: float
    threshold_tokens: float
    drained: bool

    @property
    def utilization(self) -> float:
        return self.egress_gbps / self.cap_gbps if self.cap_gbps > 0 else 0.0


@dataclass(frozen=True)
class SitePlan:
    name: str
    rate_rps: float
    busy_instances: float
    instances: int
    egress_gbps: float
    site_cap_gbps: float | None
    drained: bool

    @property
    def compute_utilization(self) -> float:
        return self.busy_instances / self.instances if self.instances else 0.0

    @property
    def cap_utilization(self) -> float | None:
        return self.egress_gbps / self.site_cap_gbps if self.site_cap_gbps else None


@dataclass(frozen=True)
class Gain:
    """What one more unit of a resource buys: the fleet's requests per second at the plan's demand mix."""

    resource: str
    added: str
    fleet_rps_gain: float


@dataclass(frozen=True)
class FleetPlan:
    multiplier: float
    """The highest common multiplier of every region's demand the fleet carries (>= 1: the demand fits)."""
    fleet_rps: float
    regions: tuple[RegionPlan, ...]
    links: tuple[LinkPlan, ...]
    sites: tuple[SitePlan, ...]
    binding: tuple[str, ...]
    gains: tuple[Gain, ...] = field(default=())


@dataclass(frozen=True)
class _Local:
    split: LengthSplit
    n_prefill: int
    n_decode: int
    rate: float


class _RegionModel:
    """One PD cluster's splits on the planner's threshold grid (computed once)."""

    def __init__(self, region: FleetRegion) -> None:
        self.region = region
        inputs = region.inputs
        self.splits = [split_lengths(inputs, t) for t in threshold_grid(inputs.lengths)]
        self.decode_rps = inputs.decode_requests_per_second()

    def local(self, rate: float, n_pd: int) -> _Local | None:
        """The highest threshold its own instances bear at ``rate`` (decode first), or None (decode cannot)."""
        inputs = self.region.inputs
        (pmin, pmax), (dmin, dmax) = inputs.prefill_bounds, inputs.decode_bounds
        n_d = max(dmin, math.ceil(rate / self.decode_rps - 1e-9))
        n_p = min(pmax, n_pd - n_d)
        n_d = n_pd - n_p
        if n_p < pmin or n_d > dmax or n_d * self.decode_rps < rate * (1 - 1e-9):
            return None

        def bears(s: LengthSplit) -> bool:
            short = rate * (1.0 - s.offload_fraction)
            return short <= 0 or short * inputs.pd_hardware.prefill_seconds(s.l_short_tokens) <= n_p

        lo, hi = 0, len(self.splits) - 1  # bears() is true at t = 0 (everything long) and falls as t rises
        if not bears(self.splits[lo]):
            return None
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if bears(self.splits[mid]) else (lo, mid - 1)
        return _Local(self.splits[lo], n_p, n_d, rate)


@dataclass
class _Solved:
    locals_: dict[str, _Local]
    flows: dict[str, float]
    """Per link: long requests per second."""


def _route(fleet: Fleet, models: Mapping[str, _RegionModel], alpha: float, n_pd: Mapping[str, int]) -> _Solved | None:
    locals_: dict[str, _Local] = {}
    for r in fleet.regions:
        local = models[r.name].local(alpha * r.demand_rps, n_pd[r.name])
        if local is None:
            return None
        locals_[r.name] = local
    sites = {s.name: s for s in fleet.sites}
    live = [
        link
        for link in fleet.links
        if not link.drained and not sites[link.site].drained and sites[link.site].instances > 0
    ]
    demand = {name: loc.rate * loc.split.offload_fraction for name, loc in locals_.items()}
    if not live:
        return _Solved(locals_, {}) if all(d <= 1e-12 for d in demand.values()) else None
    rows: list[list[float]] = []
    bounds: list[float] = []
    for r in fleet.regions:  # what each region sends in all
        rows.append([1.0 if link.pd_cluster == r.name else 0.0 for link in live])
        bounds.append(demand[r.name])
    for k, link in enumerate(live):  # each link under its cap
        kv = locals_[link.pd_cluster].split.kv_long_bytes
        rows.append([kv * 8.0 / GBPS_BITS if j == k else 0.0 for j in range(len(live))])
        bounds.append(link.cap_gbps)
    for site in fleet.sites:  # each site's instances, and its egress cap
        split = {link.name: locals_[link.pd_cluster].split for link in live if link.site == site.name}
        rows.append(
            [
                site.hardware.prefill_seconds(split[link.name].l_long_tokens) if link.name in split else 0.0
                for link in live
            ]
        )
        bounds.append(float(site.instances))
        if site.site_cap_gbps is not None:
            rows.append(
                [split[link.name].kv_long_bytes * 8.0 / GBPS_BITS if link.name in split else 0.0 for link in live]
            )
            bounds.append(site.site_cap_gbps)
    scale = [max(1.0, max(abs(v) for v in row)) for row in rows]  # rows of unit size keep the tableau stable
    rows = [[v / s for v in row] for row, s in zip(rows, scale, strict=True)]
    bounds = [b / s for b, s in zip(bounds, scale, strict=True)]
    total, x = maximize([1.0] * len(live), rows, bounds)
    if total < sum(demand.values()) * (1 - 1e-6) - 1e-9:
        return None
    return _Solved(locals_, {link.name: v for link, v in zip(live, x, strict=True)})


def _highest(fleet: Fleet, n_pd: Mapping[str, int] | None = None) -> tuple[float, _Solved | None]:
    models = {r.name: _RegionModel(r) for r in fleet.regions}
    sizes = dict(n_pd) if n_pd is not None else {r.name: r.inputs.n_pd for r in fleet.regions}
    lo, hi = 0.0, 1.0
    best = _route(fleet, models, 0.0, sizes)
    while (s := _route(fleet, models, hi, sizes)) is not None and hi < 1e9:
        lo, best, hi = hi, s, hi * 2.0
    for _ in range(50):
        mid = (lo + hi) / 2.0
        s = _route(fleet, models, mid, sizes)
        lo, hi, best = (mid, hi, s) if s is not None else (lo, mid, best)
        if hi - lo < 1e-6 * max(hi, 1e-9):
            break
    return lo, best


def _fleet_rps(fleet: Fleet, alpha: float) -> float:
    return alpha * sum(r.demand_rps for r in fleet.regions)


def plan_fleet(fleet: Fleet, gains: bool = True) -> FleetPlan:
    """The fleet's plan at its highest common demand multiplier, with what binds and where capacity pays most."""
    alpha, solved = _highest(fleet)
    if solved is None:
        raise ValueError("the fleet carries none of its demand (a PD cluster's decode cannot start)")
    sites = {s.name: s for s in fleet.sites}
    regions = []
    binding: list[str] = []
    for r in fleet.regions:
        loc = solved.locals_[r.name]
        short = loc.rate * (1.0 - loc.split.offload_fraction)
        busy = short * r.inputs.pd_hardware.prefill_seconds(loc.split.l_short_tokens) if short > 0 else 0.0
        decode_util = loc.rate / (loc.n_decode * r.inputs.decode_requests_per_second()) if loc.n_decode else 0.0
        regions.append(
            RegionPlan(
                r.name,
                loc.rate,
                loc.split.threshold_tokens,
                loc.n_prefill,
                loc.n_decode,
                loc.split.offload_fraction,
                busy / loc.n_prefill if loc.n_prefill else 0.0,
                decode_util,
            )
        )
        if decode_util >= BINDS_AT:
            binding.append(f"PD cluster {r.name}: decode")
    links = []
    for link in fleet.links:
        loc = solved.locals_[link.pd_cluster]
        rate = solved.flows.get(link.name, 0.0)
        gbps = rate * loc.split.kv_long_bytes * 8.0 / GBPS_BITS
        plan = LinkPlan(
            link.name,
            link.pd_cluster,
            link.site,
            rate,
            gbps,
            link.cap_gbps,
            loc.split.threshold_tokens,
            link.drained or sites[link.site].drained,
        )
        links.append(plan)
        if not plan.drained and plan.utilization >= BINDS_AT:
            binding.append(f"link {link.name}: its cap {link.cap_gbps:g} Gbps")
    site_plans = []
    for site in fleet.sites:
        mine = [lp for lp in links if lp.site == site.name]
        busy = sum(
            lp.rate_rps * site.hardware.prefill_seconds(solved.locals_[lp.pd_cluster].split.l_long_tokens)
            for lp in mine
            if lp.rate_rps > 0
        )
        sp = SitePlan(
            site.name,
            sum(lp.rate_rps for lp in mine),
            busy,
            site.instances,
            sum(lp.egress_gbps for lp in mine),
            site.site_cap_gbps,
            site.drained,
        )
        site_plans.append(sp)
        if not site.drained and sp.compute_utilization >= BINDS_AT:
            binding.append(f"site {site.name}: its {site.instances} instances")
        if not site.drained and (sp.cap_utilization or 0.0) >= BINDS_AT:
            binding.append(f"site {site.name}: its egress cap {site.site_cap_gbps:g} Gbps")
    result = FleetPlan(alpha, _fleet_rps(fleet, alpha), tuple(regions), tuple(links), tuple(site_plans), tuple(binding))
    return replace(result, gains=tuple(_gains(fleet, alpha))) if gains else result


def _gains(fleet: Fleet, alpha: float) -> list[Gain]:
    base = _fleet_rps(fleet, alpha)
    trials: list[tuple[str, str, Fleet, Mapping[str, int] | None]] = []
    sizes = {r.name: r.inputs.n_pd for r in fleet.regions}
    for s in fleet.sites:
        if s.drained:
            continue
        more = tuple(replace(x, instances=x.instances + 1) if x is s else x for x in fleet.sites)
        trials.append((f"site {s.name}", "+1 instance", replace(fleet, sites=more), None))
        if s.site_cap_gbps is not None:
            wider = tuple(replace(x, site_cap_gbps=s.site_cap_gbps + ADD_GBPS) if x is s else x for x in fleet.sites)
            trials.append((f"site {s.name} egress cap", f"+{ADD_GBPS:g} Gbps", replace(fleet, sites=wider), None))
    for r in fleet.regions:
        trials.append((f"PD cluster {r.name}", "+1 instance", fleet, {**sizes, r.name: sizes[r.name] + 1}))
    for link in fleet.links:
        if link.drained:
            continue
        wider_links = tuple(replace(x, cap_gbps=x.cap_gbps + ADD_GBPS) if x is link else x for x in fleet.links)
        trials.append((f"link {link.name}", f"+{ADD_GBPS:g} Gbps cap", replace(fleet, links=wider_links), None))
    out = []
    for resource, added, trial, n_pd in trials:
        a, _ = _highest(trial, n_pd)
        out.append(Gain(resource, added, max(0.0, _fleet_rps(fleet, a) - base)))
    return sorted(out, key=lambda g: -g.fleet_rps_gain)
