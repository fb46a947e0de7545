"""A fleet scenario (``examples/02-simulate/fleet.yaml``): several PrFaaS sites, several PD regions, one link per
(region, site) pair, each site's egress cap shared by its links, and the phases compared (a link squeezed or cut, a
site lost). YAML fields are camelCase; unknown fields are errors. The names follow the API's: a PrFaaS site's
``siteEgressCapGbps``, a site's or a link's ``drained`` (maintenance: no new remote prefills).

The single-pair scenario (:mod:`.scenario`) is untouched: a fleet is its own file kind (``fleet:`` at the top).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from ..api.base import ApiModel
from ..api.common import SloSpec
from .scenario import RequestClassSpec, _default_classes


class FleetSiteSpec(ApiModel):
    """One PrFaaS site."""

    name: str = Field(min_length=1, max_length=63, description="Site name.")
    accelerator: str = Field(default="H200", min_length=1, description="Hardware class (built-in).")
    instances: int = Field(default=4, ge=1, le=10_000, description="PrFaaS instances (8 GPUs each).")
    site_egress_cap_gbps: float | None = Field(
        default=None, gt=0, description="Egress cap shared by the site's links, model Gbps (none: no site cap)."
    )
    drained: bool = Field(default=False, description="Maintenance: no new remote prefills to this site.")


class FleetRegionSpec(ApiModel):
    """One PD region (its decode side is not simulated: every request decodes in its own region either way)."""

    name: str = Field(min_length=1, max_length=63, description="Region name.")
    accelerator: str = Field(default="H20", min_length=1, description="Hardware class (built-in).")
    instances: int = Field(default=8, ge=2, le=10_000, description="PD instances (prefill + decode).")
    prefill_instances: int = Field(default=3, ge=1, le=10_000, description="PD prefill instances among them.")


class FleetLinkSpec(ApiModel):
    """One inter-datacenter link, region -> site (the KV flows site -> region)."""

    region: str = Field(min_length=1, description="The PD region it serves.")
    site: str = Field(min_length=1, description="The PrFaaS site it leaves.")
    capacity_gbps: float = Field(default=100.0, gt=0, description="Link bandwidth, model Gbps.")
    max_utilization: float = Field(default=0.8, gt=0, le=1, description="Cap = capacity x this.")
    threshold_tokens: int = Field(
        default=19_634, ge=0, description="t: remote above this uncached length (default: the case study plan's t)."
    )
    drained: bool = Field(default=False, description="Maintenance: no new remote prefills over this link.")

    @property
    def name(self) -> str:
        return f"{self.region}/{self.site}"


class FleetLinkChange(ApiModel):
    """A phase's change to one link."""

    capacity_gbps: float | None = Field(default=None, ge=0, description="New bandwidth (0: cut).")
    drained: bool | None = Field(default=None, description="Drain or undrain.")


class FleetPhaseSpec(ApiModel):
    """One condition held for a whole run (the phases are compared one by one)."""

    name: str = Field(min_length=1, max_length=63, description="Phase name.")
    links: dict[str, FleetLinkChange] = Field(default_factory=dict, description="Changes by link (region/site).")
    lost_sites: list[str] = Field(default_factory=list, description="Sites gone (none of their links usable).")
    drained_sites: list[str] = Field(default_factory=list, description="Sites drained.")


class FleetSearchSpec(ApiModel):
    """The goodput search: the highest common rate multiplier at which every region meets the objective."""

    duration_seconds: float = Field(default=600.0, gt=0, description="Simulated length of one probe, s.")
    relative_precision: float = Field(default=0.02, gt=0, lt=1, description="Bisection stops at this width.")
    attainment: float = Field(default=0.9, gt=0, le=1, description="Share of requests meeting the TTFT SLO.")


class FleetSpec(ApiModel):
    """Sites, regions, links, the static pairing compared against, and the phases."""

    model: str = Field(default="internal-1t", min_length=1, description="Built-in model profile (KV size).")
    rate_per_second: float = Field(default=1.0, gt=0, description="Each region's base Poisson rate, req/s.")
    sites: list[FleetSiteSpec] = Field(min_length=1, description="PrFaaS sites.")
    regions: list[FleetRegionSpec] = Field(min_length=1, description="PD regions.")
    links: list[FleetLinkSpec] = Field(min_length=1, description="Links, one per (region, site) pair at most.")
    static_pairing: dict[str, str] = Field(default_factory=dict, description="Region -> its one site (baseline).")
    phases: list[FleetPhaseSpec] = Field(
        default_factory=lambda: [FleetPhaseSpec(name="steady")], min_length=1, description="Conditions compared."
    )

    @model_validator(mode="after")
    def _graph(self) -> FleetSpec:
        sites = {s.name for s in self.sites}
        regions = {r.name: r for r in self.regions}
        seen: set[str] = set()
        for i, link in enumerate(self.links):
            if link.region not in regions:
                raise ValueError(f"fleet.links[{i}].region: no region {link.region!r}")
            if link.site not in sites:
                raise ValueError(f"fleet.links[{i}].site: no site {link.site!r}")
            if link.name in seen:
                raise ValueError(f"fleet.links[{i}]: a second link {link.name!r} (one link per pair)")
            seen.add(link.name)
        for r in self.regions:
            if r.prefill_instances >= r.instances:
                raise ValueError(f"fleet.regions[{r.name}].prefillInstances: must leave a decode instance")
        for region, site in self.static_pairing.items():
            if f"{region}/{site}" not in seen:
                raise ValueError(f"fleet.staticPairing.{region}: no link {region}/{site}")
        for p in self.phases:
            for name in p.links:
                if name not in seen:
                    raise ValueError(f"fleet.phases[{p.name}].links.{name}: no such link")
            for s in [*p.lost_sites, *p.drained_sites]:
                if s not in sites:
                    raise ValueError(f"fleet.phases[{p.name}]: no site {s!r}")
        return self


class FleetScenario(ApiModel):
    """A fleet simulation scenario (see the module docstring)."""

    name: str = Field(default="fleet", min_length=1, max_length=253, description="Scenario name.")
    description: str = Field(default="", description="What the scenario shows.")
    seed: int = Field(default=1, ge=0, description="Seed of every random choice.")
    fleet: FleetSpec = Field(description="Sites, regions, links, phases.")
    workload: list[RequestClassSpec] = Field(
        default_factory=_default_classes, min_length=1, description="Request classes (the length mix)."
    )
    slo: SloSpec = Field(default_factory=SloSpec, description="The TTFT objective.")
    search: FleetSearchSpec = Field(default_factory=FleetSearchSpec, description="Goodput search.")
