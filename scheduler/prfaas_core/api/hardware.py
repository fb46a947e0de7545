"""Hardware of one engine instance: accelerator class, size, and optional measured overrides.

The core ships built-in profiles per accelerator class (prefill time vs uncached length; decode capacity
at the SLO); a manifest may override either, so ``prfaas plan`` gets everything from what a user applies.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from .base import ApiModel, CelRule


class PrefillTimePoint(ApiModel):
    """One measured point: prefill of ``lengthTokens`` uncached tokens takes ``seconds`` on one instance."""

    length_tokens: int = Field(ge=1, le=10_000_000, description="Uncached input length, in tokens.")
    seconds: float = Field(gt=0, le=86_400, description="Prefill latency of one instance, in seconds.")


class PrefillPolynomial(ApiModel):
    """Prefill latency as ``c0 + c1*l + c2*l^2`` seconds for ``l`` uncached tokens."""

    c0_seconds: float = Field(ge=0, description="Constant term, seconds.")
    c1_seconds_per_token: float = Field(ge=0, description="Linear term, seconds per token.")
    c2_seconds_per_token_squared: float = Field(default=0.0, ge=0, description="Quadratic term, s/token².")


class PrefillTimeSpec(ApiModel):
    """Prefill latency vs uncached length: measured points (piecewise-linear) or a polynomial."""

    __cel_rules__ = (
        CelRule(
            rule="has(self.points) != has(self.polynomial)",
            message="set exactly one of points or polynomial",
            check=lambda s: (s.points is None) != (s.polynomial is None),
            field_path=".points",
        ),
    )

    points: list[PrefillTimePoint] | None = Field(
        default=None,
        min_length=2,
        max_length=64,
        description="Measured points, interpolated piecewise-linearly (extrapolated linearly past the ends). "
        "Lengths must be distinct.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["lengthTokens"]},
    )
    polynomial: PrefillPolynomial | None = Field(default=None, description="Fitted polynomial.")

    @field_validator("points")
    @classmethod
    def _distinct_lengths(cls, v: list[PrefillTimePoint] | None) -> list[PrefillTimePoint] | None:
        if v is not None and len({p.length_tokens for p in v}) != len(v):
            raise ValueError("duplicate lengthTokens in points")
        return v


class DecodeCapacitySpec(ApiModel):
    """Decode capacity of one instance at the decode SLO: ``maxBatchSize`` streams, one step per
    ``stepTimeMs`` (so ``maxBatchSize / stepTimeMs`` output tokens per second, paper Eq. 5)."""

    max_batch_size: int = Field(ge=1, le=100_000, description="BS_max: concurrent decode streams at the SLO.")
    step_time_ms: float = Field(gt=0, le=60_000, description="T_decode: time per decode step, ms.")


class HardwareSpec(ApiModel):
    """The hardware of one engine instance."""

    accelerator: str = Field(
        min_length=1,
        max_length=63,
        description="Accelerator class, e.g. H200 or H20: names a built-in profile (see `prfaas plan "
        "--list-hardware`), or a custom class whose prefillTime (and decode) are given here.",
    )
    gpus_per_instance: int = Field(default=8, ge=1, le=1024, description="GPUs in one engine instance.")
    prefill_time: PrefillTimeSpec | None = Field(
        default=None, description="Overrides the built-in prefill latency curve of the accelerator class."
    )
    decode: DecodeCapacitySpec | None = Field(
        default=None, description="Overrides the built-in decode capacity of the accelerator class."
    )
    price_per_instance_hour: float | None = Field(
        default=None, ge=0, description="Price of one instance per hour (any currency), for cost-aware plans."
    )
