"""``spec.scaling`` and ``status.scaling`` of PDCluster and PrefillCluster: elastic capacity (issue 47).

``Fixed`` (default): ``spec.instances`` is the size, set by hand. ``Operator``: the operator sizes the cluster
from its demand (:mod:`prfaas_core.policy.elastic`) within ``minInstances``..``maxInstances`` and the budget; it
never writes ``spec.instances`` (which stays the declared starting size): the size it chose is
``status.scaling.desiredInstances`` and the workloads' replicas. ``External``: an HPA or KEDA writes
``spec.instances`` through the ``/scale`` subresource and the operator follows it, deciding nothing itself.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import ApiModel, CelRule


class ScalingSpec(ApiModel):
    """Who sizes the cluster, and within what."""

    __cel_rules__ = (
        CelRule(
            rule="self.minInstances <= self.maxInstances",
            message="minInstances must not exceed maxInstances",
            check=lambda s: s.min_instances <= s.max_instances,
            field_path=".minInstances",
        ),
    )

    mode: Literal["Fixed", "Operator", "External"] = Field(
        default="Fixed",
        description="Fixed: spec.instances, by hand. Operator: the operator sizes it from demand (status.scaling). "
        "External: an HPA/KEDA writes spec.instances through /scale and the operator follows.",
    )
    min_instances: int = Field(default=1, ge=0, le=100_000, description="Fewest instances (Operator, External).")
    max_instances: int = Field(default=100_000, ge=0, le=100_000, description="Most instances (Operator, External).")
    budget_per_hour: float | None = Field(
        default=None,
        gt=0,
        description="Most the cluster may cost per hour: instances x hardware.pricePerInstanceHour, plus the KV "
        "it sends over the link x linkPricePerGB (a PrefillCluster); Operator mode.",
    )
    link_price_per_gb: float | None = Field(
        default=None, ge=0, description="Price of one GB of KV over the inter-DC link (a PrefillCluster's budget)."
    )
    target_utilization: float = Field(
        default=0.8, gt=0, le=1, description="Fraction of an instance's modelled throughput the sizing plans for."
    )
    tolerance: float = Field(
        default=0.1, ge=0, le=1, description="No change while demand is within this fraction of the size (HPA's)."
    )
    scale_up_stabilization_seconds: int = Field(
        default=0, ge=0, le=3600, description="Scale out to the lowest recommendation of this window (0: at once)."
    )
    scale_down_stabilization_seconds: int = Field(
        default=300, ge=0, le=3600, description="Scale in only to the highest recommendation of this window."
    )
    scale_down_step: int = Field(default=1, ge=1, le=1000, description="Most instances removed per decision.")
    rate_window_seconds: int = Field(
        default=120, ge=10, le=86_400, description="Window of the engines' token and request rates the demand reads."
    )
    drain_timeout_seconds: int = Field(
        default=120,
        ge=0,
        le=86_400,
        description="Longest a pod drains (no new work; in-flight requests finish, unpulled KV is released) before "
        "a scale-in removes it anyway.",
    )
    startup_seconds: int = Field(
        default=120,
        ge=0,
        le=3600,
        description="An instance's start-up time: the demand forecast's horizon, and how long a new pod may stay "
        "Pending before ScaleOutPending is reported.",
    )


class ScalingStatus(ApiModel):
    """The sizing in force; rewritten only when the desired count, the block or the pending count moves."""

    desired_instances: int | None = Field(default=None, ge=0, description="Instances the cluster should run.")
    ready_instances: int = Field(default=0, ge=0, description="Instances serving.")
    pending_instances: int = Field(default=0, ge=0, description="Instances asked for but not running (no GPU?).")
    blocked: Literal["max", "budget"] | None = Field(
        default=None, description="A scale-out the demand asks for is held back by maxInstances or the budget."
    )
    reason: str | None = Field(default=None, max_length=1024, description="Why, at the last change.")
    last_scale_time: str | None = Field(
        default=None, description="When the desired count last changed.", json_schema_extra={"format": "date-time"}
    )


def scaling_field() -> ScalingSpec:
    return Field(
        default_factory=ScalingSpec,
        description="Elastic capacity: Fixed (default), Operator or External (HPA/KEDA through /scale).",
        json_schema_extra={"default": {}},
    )
