"""GatewayStatus: what a prefill gateway (the router binary in gateway mode, region A) serves on its status
endpoint, and what region B's operator reads to fill the remote PrefillCluster's status."""

from __future__ import annotations

from pydantic import Field

from .base import ApiModel


class GatewayStatus(ApiModel):
    """The status endpoint's JSON body (camelCase)."""

    prefill_cluster: str = Field(min_length=1, description="Name of the PrefillCluster the gateway fronts.")
    ready_instances: int = Field(ge=0, description="PrFaaS instances ready to prefill.")
    queue_depth: float = Field(ge=0, description="Requests waiting for prefill across instances.")
    egress_gbps: float = Field(ge=0, description="Measured KV egress over the last window, Gbps.")
    measured_prefill_tokens_per_second: float = Field(ge=0, description="Prefill throughput, tokens/s.")
    time: str = Field(description="RFC 3339 time of the snapshot.", json_schema_extra={"format": "date-time"})
    kv_egress_bytes: dict[str, float] = Field(
        default_factory=dict,
        description="KV bytes served since the gateway started, by link (the same count as its "
        "prfaas_gateway_kv_egress_bytes_total): what region B's routers' prfaas_router_remote_kv_bytes_total is "
        "checked against.",
    )
    scheduled_links: list[str] = Field(
        default_factory=list,
        description="The links whose KV streams this gateway books in its link calendar (source-side admission, "
        "RouterConfig gateway.admission). A router whose remote lists its link sends a long request there even "
        "when its own ledger would not admit it: the gateway reserves a window or declines with the earliest start.",
    )
