"""RouterConfig: the one contract between whoever writes the routers' configuration (the operator in a
cluster, ``prfaas up`` locally) and ``prfaas router --config FILE``. Its JSON schema is published
(``prfaas schema router-config``). Later issues extend it; unknown fields are rejected so typos surface.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..names import NO_THRESHOLD_TOKENS
from .admission import GatewayAdmission
from .base import ApiModel, CelRule, obj_default
from .common import URL_PATTERN, SloSpec
from .hardware import HardwareSpec
from .inter_dc_link import AVAILABLE_BANDWIDTH_DOC, WATERMARK_ORDER, AvailableBandwidth
from .model_profile import ModelProfileSpec


class RouterEndpoint(ApiModel):
    """One engine instance behind the router."""

    name: str = Field(min_length=1, max_length=253, description="Instance name (pod name in a cluster).")
    url: str = Field(min_length=1, max_length=2048, pattern=URL_PATTERN, description="Engine base URL.")
    role: Literal["prefill", "decode", "both"] = Field(description="Serving role.")
    kv_events_url: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^tcp://[^\s/]+:[0-9]{1,5}$",
        description="The engine's KV event publisher (tcp://host:port, vLLM's --kv-events-config): the router keeps "
        "its prefix index of this engine exactly from its events. None: learned from what the router routed.",
    )


class RemoteGateway(ApiModel):
    """A remote PrFaaS cluster's prefill gateway."""

    name: str = Field(min_length=1, max_length=253, description="The PrefillCluster's name.")
    url: str = Field(min_length=1, max_length=2048, pattern=URL_PATTERN, description="Gateway base URL.")
    status_url: str | None = Field(default=None, pattern=URL_PATTERN, description="Gateway status endpoint.")
    token_file: str | None = Field(default=None, min_length=1, description="Path of the bearer token file.")
    ca_file: str | None = Field(default=None, min_length=1, description="Path of the CA bundle (PEM).")
    link: str = Field(min_length=1, description="Name of the link its KV crosses.")
    timeout_seconds: float = Field(default=30.0, gt=0, le=3600, description="Timeout of the prefill leg.")


class RouterLink(ApiModel):
    """An inter-datacenter link as the router sees it."""

    __cel_rules__ = (WATERMARK_ORDER,)

    name: str = Field(min_length=1, description="Link name (the InterDCLink's).")
    capacity_gbps: float = Field(gt=0, description="Capacity, Gbps.")
    max_utilization: float = Field(default=0.8, gt=0, le=1, description="Cap, fraction of capacity.")
    scarce_watermark: float = Field(default=0.9, gt=0, le=1, description="Scarce above this fraction of cap.")
    abundant_watermark: float = Field(default=0.7, gt=0, le=1, description="Abundant below this fraction of cap.")
    metrics_url: str | None = Field(default=None, pattern=URL_PATTERN, description="Measured-egress endpoint.")
    available_bandwidth: AvailableBandwidth = Field(default="Measured", description=AVAILABLE_BANDWIDTH_DOC)


class RouterTimeouts(ApiModel):
    """Per-leg timeouts."""

    connect_seconds: float = Field(default=5.0, gt=0, le=600, description="Connecting to an engine or gateway.")
    prefill_seconds: float = Field(default=120.0, gt=0, le=86_400, description="The whole prefill leg.")
    kv_pull_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Longest wait for a decode leg to start when its KV crosses the link (the pull); past it the "
        "request is prefilled locally and the remote counts one failure (a cut or collapsed link).",
    )
    decode_idle_seconds: float = Field(
        default=60.0, gt=0, le=86_400, description="Longest silence between two chunks of the decode stream."
    )


class RouterLimits(ApiModel):
    """Admission limits: beyond them the router answers 429 with Retry-After instead of queueing unboundedly."""

    max_body_bytes: int = Field(default=8 << 20, ge=1024, le=1 << 30, description="Largest request body.")
    max_in_flight: int = Field(default=2048, ge=1, le=1_000_000, description="Requests in flight at most.")
    retry_after_seconds: int = Field(default=1, ge=1, le=3600, description="Retry-After on a 429.")
    max_predicted_ttft_seconds: float | None = Field(
        default=None,
        gt=0,
        le=86_400,
        description="A request whose predicted time to first token (queued prefill work ahead plus its own "
        "prefill, on the side it is routed to) exceeds this is answered 429 with Retry-After before any leg. "
        "Default: the leg's timeout (a request predicted to outlast it would fail anyway).",
    )


class RoutingParams(ApiModel):
    """The short-term policy's parameters."""

    refresh_interval_seconds: float = Field(
        default=1.0, gt=0, le=60, description="Signals (metrics, link egress, health) refresh period."
    )
    threshold_window_seconds: float = Field(
        default=30.0, gt=0, le=3600, description="Window of recent uncached lengths t_bw is computed on."
    )
    breaker_failure_threshold: int = Field(default=5, ge=1, le=1000, description="Failures that open a breaker.")
    breaker_open_seconds: float = Field(default=10.0, gt=0, le=3600, description="How long a breaker stays open.")
    breaker_probes: int = Field(
        default=1, ge=1, le=64, description="Requests that may probe a half-open breaker at once."
    )
    unhealthy_after_failures: int = Field(
        default=3,
        ge=1,
        le=100,
        description="Consecutive failed health probes (an engine's /metrics read) before it counts as unhealthy "
        "(one slow read does not); one good probe makes it healthy again.",
    )
    health_probe_seconds: float = Field(
        default=2.0, gt=0, le=60, description="Timeout of one health probe (an engine's /metrics read)."
    )
    prefix_block_tokens: int = Field(default=16, ge=1, le=4096, description="Prefix-index block size, tokens.")
    prefix_index_blocks: int = Field(
        default=262_144, ge=1, le=1 << 26, description="Blocks the prefix index remembers per cluster (LRU)."
    )
    tokenizer: Literal["chars4", "whitespace"] = Field(
        default="chars4",
        description="Token estimate used only when no tokenizerFile is configured (the engines count with the "
        "model's own tokenizer; an estimate makes uncached lengths approximate).",
    )


class ScaleConfig(ApiModel):
    """Emulation scale (``prfaas up``): model seconds per wall second, real bytes per model byte."""

    time_scale: float = Field(default=1.0, gt=0, description="Emulated time runs this many times real time.")
    byte_scale: float = Field(default=1.0, gt=0, description="Real bytes sent per model byte of KV.")


def _at_most_total(field: str) -> CelRule:
    attr = _snake(field)  # once, not at every validation (the operator builds a RouterConfig per cluster per cycle)
    return CelRule(
        rule=f"!has(self.{field}) || self.{field} <= self.maxConnections",
        message=f"{field} must not exceed maxConnections",
        check=lambda s: getattr(s, attr) is None or getattr(s, attr) <= s.max_connections,
        field_path=f".{field}",
    )


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name)


class RouterSecurity(ApiModel):
    """The listener's connection hygiene and credential reloading (router and gateway): bounds no client can
    stretch (slow or silent connections, oversized headers, connection floods, one source holding every connection)
    and live rotation of the token and TLS files kubelet updates in place."""

    __cel_rules__ = (
        _at_most_total("maxConnectionsPerClient"),
        _at_most_total("maxUnauthenticatedConnections"),
        _at_most_total("maxConnectionsPerToken"),
    )

    header_timeout_seconds: float = Field(
        default=10.0, gt=0, le=600, description="A new connection's TLS handshake and first request headers."
    )
    body_timeout_seconds: float = Field(default=30.0, gt=0, le=3600, description="Reading a request body.")
    keepalive_idle_seconds: float = Field(
        default=15.0,
        gt=0,
        le=3600,
        description="An idle keep-alive connection (or the next request's headers on it) is closed after this.",
    )
    max_connections: int = Field(
        default=4096, ge=1, le=1_000_000, description="Open connections per listener; beyond it new ones are closed."
    )
    max_connections_per_client: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Open connections from one source address; beyond it that source's new ones are closed, so no "
        "one client exhausts maxConnections. Router: every connection; gateway: connections that have not yet "
        "sent a request with the bearer token (authenticated ones count per token instead). Default: a quarter of "
        "maxConnections (1024 of 4096). Clients behind one NAT or proxy share one address: raise it there.",
    )
    max_unauthenticated_connections: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Gateway: connections, from all sources together, that have not yet sent a request with the "
        "bearer token (a router's connection is authenticated by its first request); past it the oldest of them is "
        "closed to make room, so a flood without the token never reaches the routers' share. Default: "
        "maxConnections / 16 (256 of 4096).",
    )
    max_connections_per_token: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Gateway: authenticated connections per bearer token (the routers' share: status polls and "
        "prefill legs); past it a request is answered 503 and its connection closed. Default: maxConnections "
        "less maxUnauthenticatedConnections (3840 of 4096).",
    )
    max_header_bytes: int = Field(
        default=16384, ge=1024, le=1 << 20, description="Longest request line or header field, bytes."
    )
    max_headers: int = Field(default=100, ge=8, le=10_000, description="Header fields per request at most.")
    credential_poll_seconds: float = Field(
        default=1.0, gt=0, le=300, description="How often token, certificate and key files are checked for changes."
    )
    token_overlap_seconds: float = Field(
        default=30.0,
        ge=0,
        le=86_400,
        description="After a token file changes, the previous token is still accepted this long (callers switch).",
    )
    tenant_header: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9-]+$",
        description="Router: the request header naming the client's tenant, set by the authenticating ingress (it "
        "must overwrite a client's own). Each tenant's prompts get their own prefix-cache salt (vLLM's cache_salt, "
        "the router's prefix indexes too), so no tenant learns from cached_tokens or timings whether another's "
        "prompt is cached; requests without the header share one salt. Unset: single-tenant mode, every client "
        "shares the prefix cache (and a client's own cache_salt is passed on as sent).",
    )
    server_timing: bool = Field(
        default=False,
        description="Router: send clients Server-Timing (the router's prefill/first phases and the gateway's, "
        "gw-*). Off by default: timings tell a cached prefix from an uncached one.",
    )

    def per_client(self) -> int:
        """:attr:`max_connections_per_client` or its default."""
        v = self.max_connections_per_client
        return v if v is not None else max(1, self.max_connections // 4)

    def unauthenticated(self) -> int:
        """:attr:`max_unauthenticated_connections` or its default."""
        v = self.max_unauthenticated_connections
        return v if v is not None else max(1, self.max_connections // 16)

    def per_token(self) -> int:
        """:attr:`max_connections_per_token` or its default."""
        v = self.max_connections_per_token
        return v if v is not None else max(1, self.max_connections - self.unauthenticated())


class GatewayServing(ApiModel):
    """Gateway mode: how the region-A endpoint authenticates callers and serves TLS."""

    prefill_cluster: str = Field(min_length=1, description="The PrefillCluster the gateway fronts.")
    token_file: str | None = Field(default=None, min_length=1, description="Bearer token callers must send.")
    tls_cert_file: str | None = Field(default=None, min_length=1, description="Server certificate (PEM).")
    tls_key_file: str | None = Field(default=None, min_length=1, description="Server key (PEM).")
    admission: GatewayAdmission | None = Field(
        default=None, description="Source-side admission: book each prefill's KV stream in a link calendar."
    )
    site_egress_cap_gbps: float | None = Field(
        default=None,
        gt=0,
        description="The site's egress cap (model Gbps; the PrefillCluster's spec.siteEgressCapGbps), shared by "
        "every link in links[] the gateway schedules (max-min fair over their demands). None: each link alone.",
    )


class RouterConfig(ApiModel):
    """Everything a router replica needs; written by one writer, hot-reloaded by the routers."""

    __cel_rules__ = (
        CelRule(
            rule="self.mode != 'gateway' || has(self.gateway)",
            message="gateway mode needs the gateway block",
            check=lambda s: s.mode != "gateway" or s.gateway is not None,
            field_path=".gateway",
        ),
        CelRule(
            rule="self.thresholdMinTokens <= self.thresholdMaxTokens",
            message="thresholdMinTokens must not exceed thresholdMaxTokens",
            check=lambda s: s.threshold_min_tokens <= s.threshold_max_tokens,
            field_path=".thresholdMinTokens",
        ),
    )

    pd_cluster: str = Field(min_length=1, description="The PDCluster this router fronts.")
    mode: Literal["router", "gateway"] = Field(
        default="router",
        description="router: in front of a PD cluster. gateway: in front of a PrFaaS cluster.",
    )
    endpoints: list[RouterEndpoint] = Field(default_factory=list, description="Engine instances.")
    draining: list[str] = Field(default_factory=list, description="Instance names to send no new work.")
    remotes: list[RemoteGateway] = Field(default_factory=list, description="Remote prefill gateways.")
    links: list[RouterLink] = Field(default_factory=list, description="Inter-datacenter links.")
    threshold_min_tokens: int = Field(
        ge=0, description="t_min: the planner's compute-balanced threshold; routers never go below it."
    )
    threshold_max_tokens: int = Field(
        default=NO_THRESHOLD_TOKENS, ge=0, description="Upper bound on t (above it nothing is offloaded)."
    )
    model: ModelProfileSpec = Field(description="KV model of the served model (for egress accounting).")
    tokenizer_file: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="Path of the served model's tokenizer.json (a mounted volume; the ModelProfile's "
        "tokenizer.file). Routers count tokens and hash prefixes with it, as the engines do; without it they "
        "fall back to routing.tokenizer's estimate.",
    )
    chat_template_file: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="Path of the model's chat template (Jinja). Default: chat_template.jinja beside "
        "tokenizerFile, else tokenizer_config.json's chat_template.",
    )
    pd_hardware: HardwareSpec | None = Field(
        default=None, description="Hardware of the PD instances (prefill time for the in-cluster pick)."
    )
    prfaas_hardware: HardwareSpec | None = Field(
        default=None, description="Hardware of the PrFaaS instances (each remote request's egress rate)."
    )
    gateway: GatewayServing | None = Field(default=None, description="Gateway mode settings.")
    slo: SloSpec | None = Field(
        default=None,
        description="The PDCluster's SLO (copied by the operator): routers judge each request's TTFT against its "
        "own objective (base + per-1K-tokens slope x the prompt's length) and count prfaas_router_ttft_slo_total.",
    )
    routing: RoutingParams = Field(
        default_factory=RoutingParams, description="Short-term policy.", json_schema_extra=obj_default()
    )
    timeouts: RouterTimeouts = Field(
        default_factory=RouterTimeouts, description="Timeouts.", json_schema_extra=obj_default()
    )
    limits: RouterLimits = Field(default_factory=RouterLimits, description="Limits.", json_schema_extra=obj_default())
    scale: ScaleConfig = Field(
        default_factory=ScaleConfig, description="Emulation scale.", json_schema_extra=obj_default()
    )
    security: RouterSecurity = Field(
        default_factory=RouterSecurity,
        description="Connection hygiene and credential reloading.",
        json_schema_extra=obj_default(),
    )
