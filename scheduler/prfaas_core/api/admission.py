"""The gateway's admission answer (the link scheduler at the source, ``prfaas_router.gateway.admission``).

A router's remote prefill carries three headers (:data:`~prfaas_core.names.HEADER_KV_BYTES` and its
neighbours): the request's KV bytes, the longest window wait it accepts (from its local alternative's
predicted TTFT) and the link. The gateway books a window in its link calendar and runs the prefill in it, or
declines at once: HTTP 429, ``Retry-After`` (whole seconds until the earliest start) and this body.
``prfaas crds`` publishes its JSON schema (``crds/gateway-admission.schema.json``), like RouterConfig's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from .base import ApiModel

DeclineReason = Literal["link_window", "overloaded", "kv_lease"]
PeerUrl = Annotated[str, Field(pattern=r"^https?://[^/\s]+(/\S*)?$", max_length=2048)]
"""A gateway replica's base URL."""


class AdmissionDecline(ApiModel):
    """The body of a gateway's 429 (camelCase on the wire)."""

    reason: DeclineReason = Field(
        description="link_window: the earliest window starts later than the caller accepts; overloaded: the "
        "gateway holds as many waiting prefills as it will; kv_lease: the prefill ran, but its answer waited for "
        "room on the link until the prefill engine's KV lease nearly ran out (its KV is lost to the caller: "
        "prefill elsewhere)."
    )
    earliest_start_ms: float | None = Field(
        default=None, ge=0, description="Milliseconds from now until the earliest window starts (link_window)."
    )
    predicted_ttft_ms: float | None = Field(
        default=None, ge=0, description="Predicted milliseconds from now until the decode side holds the KV."
    )
    link: str | None = Field(default=None, description="The link the window is on.")
    message: str = Field(default="", description="Why, for people.")
    kv_handle: dict[str, Any] | None = Field(
        default=None,
        description="kv_lease: the KV handle of the prefill the gateway gave up on, for the caller to release at "
        "once (its release leg through a decode instance) instead of leaving the KV on the PrFaaS engine until "
        "the engine's lease runs out.",
    )


class GatewayAdmission(ApiModel):
    """RouterConfig ``gateway.admission``: the gateway schedules its link (absent: no source-side admission)."""

    link: str = Field(min_length=1, description="The link the gateway's KV streams cross (one of links[].name).")
    replicas: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Gateway replicas behind one Service: each starts with cap / replicas of the link and, with "
        "peers, borrows what its next pull misses from the others' idle shares (the shares never sum past the cap).",
    )
    peers: list[PeerUrl] = Field(
        default_factory=list,
        max_length=64,
        description="Base URLs of the gateway replicas (this one may be listed: it recognises itself) that lend "
        "each other their idle share of the link. A replica lends only to callers whose address one of these "
        "resolves to (others: 403). Empty: each replica keeps cap / replicas, lends nothing, and lets one pull at a "
        "time when a pull is faster than that, so replicas together may pass the cap.",
    )
    loan_max_fraction: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="The largest fraction of the link's ceiling one loan request may ask a replica for; a request "
        "past it is refused (400 naming fraction) and counted (prfaas_gateway_loans_total{result=over_bounds}). "
        "Default: 1 - 1/replicas, the most a pull can miss while every replica keeps its own share.",
    )
    loan_max_lease_seconds: float = Field(
        default=300.0,
        gt=0,
        le=86_400,
        description="The longest lease one loan request may ask for (wall seconds: a pull's lease, about three "
        "times its transfer plus a few seconds); a request past it is refused (400 naming leaseS) and counted.",
    )
    peer_ca_file: str | None = Field(
        default=None, min_length=1, description="CA (PEM) that verifies https peers (default: the system's)."
    )
    stream_timing: Literal["layer-wise", "pull-after-prefill"] = Field(
        default="pull-after-prefill",
        description="When a prefill's KV crosses the link: after the prefill answers (vLLM's NixlConnector) or "
        "with it, layer by layer.",
    )
    pull_gbps: float | None = Field(
        default=None, gt=0, description="What one pull achieves, Gbps (default: the replica's share of the cap)."
    )
    instance_gbps: float | None = Field(
        default=None,
        gt=0,
        description="Each PrFaaS instance's egress is paced to this rate, Gbps (the operator sets it with a "
        "PrefillCluster's egressPacing PerInstance): one instance's pulls share it, so the gateway lets a pull onto "
        "the wire only while its instance's pulls fit in it, and another instance's pull goes first. None: pulls "
        "add up whichever instance serves them.",
    )
    lane_order: Literal["deadline", "arrival"] = Field(
        default="deadline",
        description="The order of the prefills held for a PrFaaS instance (lane): deadline — a request due "
        "sooner (its TTFT objective, x-prfaas-slo-ttft-ms) may go ahead of held ones due later, each kept within its "
        "objective when predicted to make it, else within what its caller accepts (x-prfaas-max-ttft-ms); arrival — "
        "first booked, first served.",
    )
    max_waiting: int = Field(
        default=256, ge=1, description="Prefills held for a later window at once; beyond it: 429 overloaded."
    )
    kv_lease_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="How long a prefill engine keeps a prefill's KV for a pull that has not started (wall "
        "seconds; vLLM's NixlConnector kv_lease_duration, 30 s; older vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT). A "
        "pull-after-prefill answer is held for room on the link at most 80 % of it; then the gateway answers 429 "
        "kv_lease and the caller prefills elsewhere, instead of sending a decode to pull KV already freed.",
    )

    def max_loan_fraction(self) -> float:
        """:attr:`loan_max_fraction`, or its default ``1 - 1 / replicas``."""
        return self.loan_max_fraction if self.loan_max_fraction is not None else 1.0 - 1.0 / self.replicas

    @field_validator("peers")
    @classmethod
    def _peer_urls(cls, peers: list[str]) -> list[str]:
        return [url.rstrip("/") for url in peers]
