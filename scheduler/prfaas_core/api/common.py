"""Types shared by the cluster kinds: endpoints, transports, SLOs, decision records, status summaries."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from pydantic import Field

from .base import ApiModel, CelRule, LocalObjectRef, SecretKeyRef

URL_PATTERN = r"^https?://[^\s/$.?#][^\s]*$"
REGION_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


Region = Annotated[
    str,
    Field(min_length=1, max_length=63, pattern=REGION_PATTERN, description="Region (lowercase DNS label)."),
]


class GatewayEndpointSpec(ApiModel):
    """The prefill gateway's endpoint: exported by region A, dialled by region B."""

    url: str = Field(min_length=1, max_length=2048, pattern=URL_PATTERN, description="Base URL of the prefill gateway.")
    status_path: str = Field(
        default="/status",
        min_length=1,
        max_length=256,
        pattern=r"^/",
        description="Path of its status endpoint.",
    )
    tls_secret_ref: LocalObjectRef | None = Field(
        default=None,
        description="Secret with the TLS material: the server certificate (tls.crt/tls.key) in the exporting "
        "region, the CA bundle (ca.crt) in the dialling region.",
    )
    token_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret key holding the bearer token the gateway requires."
    )


class PortRange(ApiModel):
    """An inclusive TCP port range."""

    __cel_rules__ = (
        CelRule(
            rule="self.start <= self.end",
            message="start must not exceed end",
            check=lambda r: r.start <= r.end,
            field_path=".start",
        ),
    )

    start: int = Field(ge=1, le=65_535, description="First port.")
    end: int = Field(ge=1, le=65_535, description="Last port.")


class KvTransportSpec(ApiModel):
    """How KV crosses from prefill to decode instances (the engines' KV connector settings)."""

    connector: Literal["NixlConnector", "MooncakeConnector"] = Field(
        default="NixlConnector",
        description="KV connector the engines run: only connectors the launch code renders (vLLM's; "
        "the SGLang values went until an SGLang engine kind is rendered, docs/upgrade.md).",
    )
    protocol: Literal["tcp", "rdma"] = Field(default="tcp", description="Transport protocol; tcp across datacenters.")
    parallel_connections: int = Field(
        default=8, ge=1, le=1024, description="Parallel TCP connections per transfer (multi-connection TCP)."
    )
    side_channel_port: int | None = Field(
        default=None, ge=1, le=65_535, description="Connector side-channel/bootstrap port on the engines."
    )
    kv_role: Literal["kv_producer", "kv_consumer", "kv_both"] | None = Field(
        default=None,
        description="vLLM kv_role; default from the role: kv_producer for PrFaaS and Scale-mode prefill, "
        "kv_consumer for Scale-mode decode, kv_both for Relabel-mode instances (which flip role).",
    )
    buffer_device: Literal["cpu", "cuda"] = Field(
        default="cpu",
        description="Where the connector stages KV (kv_buffer_device): cpu (host buffers, what UCX's TCP "
        "transport moves) or cuda.",
    )
    data_ports: PortRange | None = Field(
        default=None,
        description="NixlConnector over TCP: the ports UCX listens on for KV data (UCX_TCP_PORT_RANGE), so that "
        "the chart's NetworkPolicy admits only them (and the side channel) from the peer region; default: "
        "ephemeral ports (the policy then admits every TCP port from the peer CIDRs).",
    )
    net_device: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        description="The network interface the KV transport binds (UCX_NET_DEVICES, e.g. eth0); default: UCX's choice.",
    )


class RoleRange(ApiModel):
    """Bounds on one role's instance count."""

    __cel_rules__ = (
        CelRule(
            rule="self.min <= self.max",
            message="min must not exceed max",
            check=lambda r: r.min <= r.max,
            field_path=".min",
        ),
    )

    min: int = Field(default=1, ge=0, le=100_000, description="Fewest instances in this role.")
    max: int = Field(default=1024, ge=0, le=100_000, description="Most instances in this role.")


class TtftSlo(ApiModel):
    """TTFT SLO as an affine function of the whole prompt's length as the client sent it (the engine's
    ``prompt_tokens``, cached or not): ``base + slope * l / 1024``
    (:func:`prfaas_core.request.slo.ttft_objective_s`)."""

    base_seconds: float = Field(default=2.0, gt=0, le=3600, description="TTFT allowed at zero length, s.")
    seconds_per_k_tokens: float = Field(
        default=0.2,
        ge=0,
        le=3600,
        description="Extra TTFT allowed per 1K (1024) prompt tokens, s: the whole prompt as the client sent it (the "
        "engine's prompt_tokens, cached or not).",
    )


class SloSpec(ApiModel):
    """Service-level objectives: used by alerts, goodput and the decode capacity check."""

    ttft: TtftSlo = Field(
        default_factory=TtftSlo,
        description="TTFT objective, judged on the whole prompt as the client sent it (prompt_tokens), cached or not.",
        json_schema_extra={"default": {}},
    )
    min_decode_tokens_per_second: float = Field(
        default=40.0, gt=0, le=100_000, description="Minimum decode rate per stream, tokens/s."
    )
    objective_ratio: float = Field(
        default=0.95, gt=0, le=1, description="Fraction of requests that must meet the SLO (for burn alerts)."
    )


def rfc3339(time_s: float) -> str:
    """A Unix time as Kubernetes writes times (RFC 3339, UTC, whole seconds, ``Z``)."""
    return dt.datetime.fromtimestamp(time_s, tz=dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_rfc3339(value: str | None) -> float | None:
    """The inverse of :func:`rfc3339` (None for a missing or malformed time)."""
    if not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


DecisionAction = Literal["Hold", "FlipToDecode", "FlipToPrefill", "Drain", "Rebalance", "Suspended"]


class DecisionRecord(ApiModel):
    """One long-term decision, with its reason (shown in status and `kubectl describe`)."""

    time: str = Field(
        description="RFC 3339 time of the decision; a Hold repeated in the same words (its figures aside) "
        "keeps its first time and reason (renewed with the status heartbeat).",
        json_schema_extra={"format": "date-time"},
    )
    action: DecisionAction = Field(description="What was decided.")
    reason: str = Field(min_length=1, max_length=1024, description="Why, in words an SRE can act on.")
    prefill_from: int = Field(ge=0, description="Prefill instances before.")
    decode_from: int = Field(ge=0, description="Decode instances before.")
    prefill_to: int = Field(ge=0, description="Prefill instances after.")
    decode_to: int = Field(ge=0, description="Decode instances after.")
    threshold_tokens: int | None = Field(default=None, ge=0, description="Threshold t published with it.")


class LoopMemory(ApiModel):
    """What the long-term loop must remember between cycles that the cluster itself does not show: the
    current verdict and for how many consecutive cycles it held (so a restart does not reset hysteresis)."""

    verdict: Literal["decode-bound", "prefill-bound"] | None = Field(default=None, description="Current verdict.")
    streak: int = Field(default=0, ge=0, le=1_000_000, description="Consecutive cycles it has held.")


class RoleStatus(ApiModel):
    """Instance counts of one role."""

    current: int = Field(default=0, ge=0, description="Instances serving this role now.")
    desired: int = Field(default=0, ge=0, description="Instances the long-term policy wants.")
    ready: int = Field(default=0, ge=0, description="Instances ready in this role.")
    draining: int = Field(default=0, ge=0, description="Instances draining out of this role.")


class PDClusterSummary(ApiModel):
    """Pre-formatted strings for `kubectl get` printer columns."""

    prefill: str = Field(default="", max_length=32, description="ready/desired prefill instances, e.g. 3/3.")
    decode: str = Field(default="", max_length=32, description="ready/desired decode instances, e.g. 5/5.")
    threshold: str = Field(default="", max_length=32, description="Threshold in force, e.g. 19.4K.")
    link: str = Field(default="", max_length=32, description="Link utilisation, e.g. 13%.")
