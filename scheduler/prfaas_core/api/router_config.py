"""RouterConfig: the one contract between whoever writes the routers' configuration (the operator in a
cluster, ``prfaas up`` locally) and ``prfaas router --config FILE``. Its JSON schema is published
(``prfaas schema router-config``). Later issues extend it; unknown fields are rejected so typos surface.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import ApiModel, CelRule
from .common import URL_PATTERN
from .model_profile import ModelProfileSpec


class RouterEndpoint(ApiModel):
    """One engine instance behind the router."""

    name: str = Field(min_length=1, max_length=253, description="Instance name (pod name in a cluster).")
    url: str = Field(min_length=1, max_length=2048, pattern=URL_PATTERN, description="Engine base URL.")
    role: Literal["prefill", "decode", "both"] = Field(description="Serving role.")


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

    __cel_rules__ = (
        CelRule(
            rule="self.abundantWatermark < self.scarceWatermark",
            message="abundantWatermark must be below scarceWatermark",
            check=lambda s: s.abundant_watermark < s.scarce_watermark,
            field_path=".abundantWatermark",
        ),
    )

    name: str = Field(min_length=1, description="Link name (the InterDCLink's).")
    capacity_gbps: float = Field(gt=0, description="Capacity, Gbps.")
    max_utilization: float = Field(default=0.8, gt=0, le=1, description="Cap, fraction of capacity.")
    scarce_watermark: float = Field(default=0.9, gt=0, le=1, description="Scarce above this fraction of cap.")
    abundant_watermark: float = Field(default=0.7, gt=0, le=1, description="Abundant below this fraction of cap.")
    metrics_url: str | None = Field(default=None, pattern=URL_PATTERN, description="Measured-egress endpoint.")


class RouterConfig(ApiModel):
    """Everything a router replica needs; written by one writer, hot-reloaded by the routers."""

    __cel_rules__ = (
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
        default=1 << 30, ge=0, description="Upper bound on t (above it nothing is offloaded)."
    )
    model: ModelProfileSpec = Field(description="KV model of the served model (for egress accounting).")
