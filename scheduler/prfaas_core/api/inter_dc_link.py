"""InterDCLink: the inter-datacenter link from a PrefillCluster to a PDCluster.

Its cap (``maxUtilization``) is a ceiling enforced by the routers' admission; the *scarce* state starts at
``scarceWatermark`` x cap and ends below ``abundantWatermark`` x cap (hysteresis), so the threshold rises
before the cap is reached (ARCHITECTURE.md, "The router's configuration").
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..names import GROUP_VERSION, KIND_INTER_DC_LINK, METRIC_ROUTER_REMOTE_BYTES
from .base import ApiModel, CelRule, Condition, LocalObjectRef, ObjectMeta, conditions_field

WATERMARK_ORDER = CelRule(
    rule="self.abundantWatermark < self.scarceWatermark",
    message="abundantWatermark must be below scarceWatermark (the gap is the hysteresis band)",
    check=lambda s: s.abundant_watermark < s.scarce_watermark,
    field_path=".abundantWatermark",
)
"""The one rule every link spec with watermarks carries (the InterDCLink, the router's link, the simulator's)."""


AvailableBandwidth = Literal["Measured", "Configured"]
AVAILABLE_BANDWIDTH_DOC = (
    "Measured (default): routers bound the capacity by what their KV pulls achieve (a squeezed link is seen "
    "from late pulls, a cut from a stalled one) and probe back up. Configured: the capacity is guaranteed (a "
    "dedicated or committed-rate link, or engines on one host): routers never lower it, so a decode engine that "
    "is slow to start its pulls is not taken for a squeezed link; a cut is still found by the breaker."
)


DRAINED_LINK_DOC = (
    "Maintenance drain: true takes the link out of service on purpose. The operator leaves its remote out of the "
    "PD cluster's routers (no new remote prefill crosses it; the routers' other links, else their local path, take "
    "the work) and keeps the link itself in their configuration, so the prefills already in flight over it finish "
    "and are counted; the link reports Drained=True. False (default): in service."
)


class LinkMeasurementSpec(ApiModel):
    """Where the link's measured egress comes from."""

    available_bandwidth: AvailableBandwidth = Field(default="Measured", description=AVAILABLE_BANDWIDTH_DOC)

    egress_query: str = Field(
        default=f'sum(rate({METRIC_ROUTER_REMOTE_BYTES}{{link="$link"}}[1m])) * 8 / 1e9',
        min_length=1,
        max_length=4096,
        description="PromQL giving the link's egress in Gbps (operator); $link is the link's name. Default: the KV "
        "bytes this region's routers admitted over the link (region B's Prometheus cannot read region A's); "
        "node_exporter's interface counters (rate(node_network_transmit_bytes_total{device=...})) are an "
        "alternative where the link has a dedicated interface.",
    )
    metrics_url: str | None = Field(
        default=None,
        min_length=1,
        max_length=2048,
        pattern=r"^https?://",
        description="Optional: the /metrics of a link emulator (the local stack only), read by routers about once "
        "a second; unset in a real deployment, where routers estimate the egress from the transfers they "
        "admitted.",
    )


class InterDCLinkSpec(ApiModel):
    """Desired state of an inter-datacenter link."""

    __cel_rules__ = (WATERMARK_ORDER,)

    prefill_cluster_ref: LocalObjectRef = Field(description="The PrefillCluster sending KV over the link.")
    pd_cluster_ref: LocalObjectRef = Field(description="The PDCluster receiving KV.")
    capacity_gbps: float = Field(gt=0, le=1_000_000, description="Link capacity, Gbps (10^9 bit/s).")
    max_utilization: float = Field(
        default=0.8, gt=0, le=1, description="Cap: fraction of capacity KV may use; admission enforces it."
    )
    scarce_watermark: float = Field(
        default=0.9, gt=0, le=1, description="Fraction of the cap above which the link is scarce."
    )
    abundant_watermark: float = Field(
        default=0.7,
        gt=0,
        le=1,
        description="Fraction of the cap below which a scarce link is abundant again.",
    )
    rtt_ms: float = Field(default=1.0, ge=0, le=10_000, description="Round-trip time, ms.")
    cost_per_gb_usd: float | None = Field(default=None, ge=0, description="Egress price per GB (10^9 B), USD.")
    measurement: LinkMeasurementSpec = Field(
        default_factory=LinkMeasurementSpec,
        description="Measured egress source.",
        json_schema_extra={"default": {}},
    )
    drained: bool = Field(default=False, description=DRAINED_LINK_DOC)


class InterDCLinkStatus(ApiModel):
    """Measured state of the link."""

    observed_generation: int | None = Field(default=None, ge=0, description="Generation last processed.")
    measured_egress_gbps: float | None = Field(
        default=None, ge=0, description="Measured egress, Gbps (written with utilization, when that moves)."
    )
    utilization: float | None = Field(
        default=None,
        ge=0,
        description="Measured egress / capacity; rewritten when it moves by more than 0.01 (or the state changes).",
    )
    utilization_percent: str = Field(default="", max_length=16, description="Utilisation for printing.")
    state: Literal["Abundant", "Scarce", "Unknown"] = Field(default="Unknown", description="Bandwidth state.")
    threshold_floor_tokens: int | None = Field(
        default=None,
        ge=0,
        description="Bandwidth-feasible lower bound on t at the measured load; rewritten when it moves by more "
        "than 2 %.",
    )
    last_measured_time: str | None = Field(
        default=None,
        description="Time of the last measurement written: with any change above, else with the status "
        "heartbeat (operator --status-heartbeat-seconds, 300 s, or 20 cycles if longer; each object's falls "
        "between one and two of them). The Degraded condition says whether this cycle measured.",
        json_schema_extra={"format": "date-time"},
    )
    conditions: list[Condition] = conditions_field("Ready, Degraded, Drained.")


class InterDCLink(ApiModel):
    """An inter-datacenter link."""

    api_version: Literal["prfaas.io/v1alpha1"] = Field(default=GROUP_VERSION, description="API version.")
    kind: Literal["InterDCLink"] = Field(default=KIND_INTER_DC_LINK, description="Kind.")
    metadata: ObjectMeta
    spec: InterDCLinkSpec
    status: InterDCLinkStatus | None = None
