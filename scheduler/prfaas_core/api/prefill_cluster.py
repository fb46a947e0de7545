"""PrefillCluster: a prefill-only PrFaaS cluster (compute-dense, e.g. H200) in some datacenter.

In the region that runs it (``mode: Managed``, region A) the operator observes its prefill workload and
configures the gateway that exports it. In the region that uses it (``mode: Remote``, region B) the object
*describes* the remote cluster: its endpoint and secrets, declared instances and hardware; its status is
filled from the remote gateway's status endpoint (ARCHITECTURE.md, "Two regions, two API servers").
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from ..names import GROUP_VERSION, KIND_PREFILL_CLUSTER
from .admission import GatewayAdmission
from .base import (
    DNS_SUBDOMAIN_PATTERN,
    ApiModel,
    CelRule,
    Condition,
    LocalObjectRef,
    ObjectMeta,
    WorkloadRef,
    conditions_field,
)
from .common import GatewayEndpointSpec, KvTransportSpec, Region
from .engine import EngineSettingsSpec
from .hardware import HardwareSpec
from .scaling import ScalingSpec, ScalingStatus, scaling_field

DRAINED_SITE_DOC = (
    "Maintenance drain of the site: true takes it out of service on purpose; no new remote prefill is sent to it, "
    "the prefills already in flight finish. Managed: the operator lists every prefill pod in its gateway's drain "
    "list (the gateway starts nothing new there; what it holds finishes). Remote: the operator leaves the site out "
    "of this region's routers (their other sites, else their local path, take the work), keeping its links in their "
    "configuration so in-flight pulls are counted. Set it in the region that runs the site and in every region that "
    "uses it (each region's routers read only their own API server). The PrefillCluster reports Drained=True."
)
SITE_CAP_DOC = (
    "Optional: the site's egress cap, Gbps, shared by all its links (they leave through the same NICs and the "
    "same paid egress). Each link keeps its own cap (capacityGbps x maxUtilization); the site cap bounds their sum. "
    "Absent: only the links' caps. `prfaas validate` warns when it is at or above the sum of its links' caps (it "
    "can never bind: not wrong, but a stale or mistyped figure), and status.siteCap says whether it binds."
)


class ScheduledLink(ApiModel):
    """One more link a site's gateway schedules (``linkScheduling.links``): another PD cluster's InterDCLink."""

    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="The InterDCLink's name in the decoding region.",
    )
    capacity_gbps: float = Field(gt=0, le=100_000, description="The link's capacity, Gbps (its InterDCLink's).")
    max_utilization: float = Field(
        default=0.8, gt=0, le=1, description="The cap: fraction of capacity KV may use (its InterDCLink's)."
    )


class LinkSchedulingSpec(GatewayAdmission):
    """``spec.linkScheduling`` of a Managed PrefillCluster: its gateway books every KV stream it serves in a link
    calendar under the cap (source-side admission), the operator writing it into the gateway's RouterConfig
    (``gateway.admission`` and the link). ``link`` is the InterDCLink's name in the decoding region; its capacity
    and cap are repeated here, since this region has no InterDCLink of its own."""

    __cel_rules__ = (
        CelRule(
            rule="self.egressPacing != 'PerInstance' || !has(self.pullGbps)",
            message="egressPacing PerInstance sets what one pull achieves (cap / instances): leave pullGbps out",
            check=lambda s: s.egress_pacing != "PerInstance" or s.pull_gbps is None,
            field_path=".pullGbps",
            reason="FieldValueForbidden",
        ),
        CelRule(
            rule="self.egressPacing != 'PerInstance' || !has(self.instanceGbps)",
            message="egressPacing PerInstance sets each instance's paced rate (cap / instances): leave instanceGbps "
            "out",
            check=lambda s: s.egress_pacing != "PerInstance" or s.instance_gbps is None,
            field_path=".instanceGbps",
            reason="FieldValueForbidden",
        ),
        CelRule(
            rule="!has(self.peers) || size(self.peers) == 0 || size(self.peers) == self.replicas"
            " || size(self.peers) == self.replicas - 1",
            message="peers lists every gateway replica (replicas of them; one replica's own URL may be left out): "
            "a replica missing from peers lends and borrows nothing, one too many is asked in vain",
            check=lambda s: len(s.peers) in (0, s.replicas, s.replicas - 1),
            field_path=".peers",
        ),
    )

    capacity_gbps: float = Field(gt=0, le=100_000, description="The link's capacity, Gbps (its InterDCLink's).")
    max_utilization: float = Field(
        default=0.8, gt=0, le=1, description="The cap: fraction of capacity KV may use (its InterDCLink's)."
    )
    egress_pacing: Literal["None", "PerInstance"] = Field(
        default="None",
        description="PerInstance: the operator limits each prefill pod's egress to cap / spec.instances (the "
        "kubernetes.io/egress-bandwidth annotation on the workload's pod template, enforced by the CNI's bandwidth "
        "plugin; the pods restart to take it, and again when the cap or spec.instances changes) and the gateway "
        "books each pull at that rate, so one pull per instance fits under the cap at once. None: pulls run as fast "
        "as the wire lets them, and a pull faster than what the cap leaves waits, so the cap may sit partly idle "
        "on a tight link.",
    )
    links: list[ScheduledLink] = Field(
        default_factory=list,
        max_length=64,
        description="A site serving several PD clusters: the links besides link (one per PD cluster, each with its "
        "InterDCLink's capacity and cap; each name once, and not link's). Empty (default): the one link.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    @model_validator(mode="after")
    def _links_once(self) -> LinkSchedulingSpec:
        names = [x.name for x in self.links]
        if len(set(names)) != len(names) or self.link in names:
            raise PydanticCustomError(
                "cel_rule",
                "{message}",
                {
                    "message": "links names each link once, and not link's (one link per PD cluster and site)",
                    "field_path": ".links",
                    "rule": "",
                },
            )
        return self

    def all_links(self) -> list[ScheduledLink]:
        """``link`` and then ``links``: every link the site's gateway schedules."""
        first = ScheduledLink(name=self.link, capacity_gbps=self.capacity_gbps, max_utilization=self.max_utilization)
        return [first, *self.links]


class PrefillClusterSpec(ApiModel):
    """Desired state of a PrFaaS prefill cluster."""

    __cel_rules__ = (
        CelRule(
            rule="self.mode != 'Managed' || has(self.workload)",
            message="a Managed PrefillCluster must name the workload that holds its prefill instances",
            check=lambda s: s.mode != "Managed" or s.workload is not None,
            field_path=".workload",
            reason="FieldValueRequired",
        ),
        CelRule(
            rule="self.mode != 'Remote' || has(self.endpoint)",
            message="a Remote PrefillCluster must give the endpoint of the other region's prefill gateway",
            check=lambda s: s.mode != "Remote" or s.endpoint is not None,
            field_path=".endpoint",
            reason="FieldValueRequired",
        ),
        CelRule(
            rule="self.mode != 'Remote' || !has(self.linkScheduling)",
            message="a Remote PrefillCluster's gateway runs in another region; schedule the link there",
            check=lambda s: s.mode != "Remote" or s.link_scheduling is None,
            field_path=".linkScheduling",
            reason="FieldValueForbidden",
        ),
        CelRule(
            rule="self.mode != 'Remote' || !has(self.workload)",
            message="a Remote PrefillCluster is run by another region; it has no local workload",
            check=lambda s: s.mode != "Remote" or s.workload is None,
            field_path=".workload",
            reason="FieldValueForbidden",
        ),
        CelRule(
            rule="self.mode != 'Remote' || self.scaling.mode == 'Fixed'",
            message="a Remote PrefillCluster is sized by the region that runs it; its scaling.mode stays Fixed here",
            check=lambda s: s.mode != "Remote" or s.scaling.mode == "Fixed",
            field_path=".scaling.mode",
            reason="FieldValueForbidden",
        ),
        CelRule(
            rule="self.scaling.mode != 'External' || (self.instances >= self.scaling.minInstances && "
            "self.instances <= self.scaling.maxInstances)",
            message="External scaling: instances (what /scale writes) must lie within scaling.minInstances and "
            "scaling.maxInstances",
            check=lambda s: (
                s.scaling.mode != "External" or s.scaling.min_instances <= s.instances <= s.scaling.max_instances
            ),
            field_path=".instances",
        ),
    )

    region: Region
    datacenter: str | None = Field(default=None, min_length=1, max_length=63, description="Datacenter or zone.")
    mode: Literal["Managed", "Remote"] = Field(
        default="Managed",
        description="Managed: this region runs the cluster. Remote: it describes a cluster another region runs.",
    )
    model_profile_ref: LocalObjectRef = Field(description="The ModelProfile (cluster-scoped) it serves.")
    instances: int = Field(
        ge=0,
        le=100_000,
        description="Declared prefill instances (N_prfaas): the size (Fixed), the starting size (Operator) or what "
        "an HPA/KEDA writes through /scale (External).",
    )
    hardware: HardwareSpec = Field(description="Hardware of one instance.")
    workload: WorkloadRef | None = Field(
        default=None, description="Workload holding the prefill instances (Managed only)."
    )
    endpoint: GatewayEndpointSpec | None = Field(
        default=None,
        description="The prefill gateway: the endpoint this region exports (Managed) or dials (Remote).",
    )
    kv_transport: KvTransportSpec = Field(
        default_factory=KvTransportSpec,
        description="KV transport settings.",
        json_schema_extra={"default": {}},
    )
    engine: EngineSettingsSpec = Field(
        default_factory=EngineSettingsSpec,
        description="How the engines start (model path, ports, block size); `prfaas engines` renders them.",
        json_schema_extra={"default": {}},
    )
    link_scheduling: LinkSchedulingSpec | None = Field(
        default=None,
        description="Managed only: the gateway schedules the inter-DC link its KV crosses (absent: it does not; "
        "the routers' own ledgers admit).",
    )
    site_egress_cap_gbps: float | None = Field(default=None, gt=0, le=1_000_000, description=SITE_CAP_DOC)
    drained: bool = Field(default=False, description=DRAINED_SITE_DOC)
    scaling: ScalingSpec = scaling_field()


class SiteLinkStatus(ApiModel):
    """One link of the site as this region's operator sees it."""

    name: str = Field(min_length=1, description="The link (InterDCLink) name.")
    pd_cluster: str | None = Field(default=None, description="The PD cluster it reaches (where known here).")
    cap_gbps: float = Field(ge=0, description="Its cap: capacityGbps x maxUtilization, Gbps.")
    drained: bool = Field(default=False, description="Drained (the link's or the site's spec.drained).")


class SiteCapStatus(ApiModel):
    """The site egress cap against its links."""

    cap_gbps: float = Field(ge=0, description="spec.siteEgressCapGbps.")
    links_cap_gbps: float = Field(ge=0, description="The sum of the caps of its links in service (not drained).")
    binds: bool = Field(
        description="Whether the site cap binds: below the sum of its links' caps, so the links together cannot "
        "all run at their own caps at once."
    )


class PrefillClusterStatus(ApiModel):
    """Observed state of a prefill cluster."""

    observed_generation: int | None = Field(default=None, ge=0, description="Generation last processed.")
    ready_instances: int = Field(default=0, ge=0, description="Prefill instances ready to serve.")
    queue_depth: float = Field(
        default=0.0, ge=0, description="Requests waiting for prefill; rewritten when it moves by more than 1."
    )
    measured_prefill_tokens_per_second: float = Field(
        default=0.0,
        ge=0,
        description="Measured prefill throughput over the last window, tokens/s; rewritten when it moves by "
        "more than 5 %.",
    )
    egress_gbps: float = Field(
        default=0.0, ge=0, description="Measured KV egress, Gbps; rewritten when it moves by more than 5 %."
    )
    replicas: int = Field(default=0, ge=0, description="Instances ready (/scale's status.replicas).")
    selector: str | None = Field(default=None, description="Label selector of the instances' pods (/scale's).")
    scaling: ScalingStatus | None = Field(default=None, description="Elastic capacity in force (Operator mode).")
    last_sync_time: str | None = Field(
        default=None,
        description="When the status was last refreshed: with any change above, else with the status "
        "heartbeat (operator --status-heartbeat-seconds, 300 s, or 20 cycles if longer; each object's falls "
        "between one and two of them).",
        json_schema_extra={"format": "date-time"},
    )
    links: list[SiteLinkStatus] = Field(
        default_factory=list, max_length=64, description="The site's links known in this region."
    )
    site_cap: SiteCapStatus | None = Field(default=None, description="Set when spec.siteEgressCapGbps is.")
    conditions: list[Condition] = conditions_field("Ready, Degraded, Drained, SiteCapBinding.")


class PrefillCluster(ApiModel):
    """A PrFaaS prefill cluster."""

    api_version: Literal["prfaas.io/v1alpha1"] = Field(default=GROUP_VERSION, description="API version.")
    kind: Literal["PrefillCluster"] = Field(default=KIND_PREFILL_CLUSTER, description="Kind.")
    metadata: ObjectMeta
    spec: PrefillClusterSpec
    status: PrefillClusterStatus | None = None
