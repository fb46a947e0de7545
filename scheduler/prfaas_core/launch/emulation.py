"""The one scale setting of an emulated scenario: how much faster than real time it runs, and how many real
bytes stand for one byte of KV.

Engines (``prfaas engine``) and the link (``prfaas link``) take the same :class:`ScaleSettings`, so a scenario
scales consistently: a KV cache of ``S`` model bytes crosses the wire as ``S·byte_scale`` real bytes, over a
link whose real rate is ``capacity·byte_scale·time_scale`` — so the transfer takes ``S·8/capacity`` *model*
seconds, i.e. ``1/time_scale`` of that on the wall clock, exactly like every prefill and decode step.

Convention for what the emulators report (metrics, state): every quantity is a *model* quantity — durations
in model seconds (wall × ``time_scale``), bytes in model bytes (wire ÷ ``byte_scale``), tokens as tokens. Only
the scraper's clock is wall time, so a ``rate()`` over a wall-clock window is ``time_scale`` × the model rate;
:meth:`ScaleSettings.model_rate` converts it back.

Why ``byte_scale`` defaults below 1: the paper's 1T model holds 190 MiB–2.3 GiB of KV per request; moving that
for real on one small test machine would measure the machine's memory bandwidth, not the system. At 1/1000 the
proportions (and every ratio the planner and router use) are kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..names import GBPS_BITS

DEFAULT_TIME_SCALE = 1.0
DEFAULT_BYTE_SCALE = 1e-3


@dataclass(frozen=True)
class ScaleSettings:
    """``time_scale`` > 1 runs faster than real time; ``byte_scale`` real bytes stand for one model byte."""

    time_scale: float = DEFAULT_TIME_SCALE
    byte_scale: float = DEFAULT_BYTE_SCALE

    def __post_init__(self) -> None:
        for name in ("time_scale", "byte_scale"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0 (got {value!r})")

    def wall_seconds(self, model_seconds: float) -> float:
        """Wall-clock seconds that ``model_seconds`` of emulated time take."""
        return model_seconds / self.time_scale

    def model_seconds(self, wall_seconds: float) -> float:
        """Model seconds that ``wall_seconds`` on the wall clock stand for."""
        return wall_seconds * self.time_scale

    def wire_bytes(self, model_bytes: float) -> int:
        """Real bytes sent for ``model_bytes`` of KV: rounded, and at least 1 for any positive size."""
        if model_bytes <= 0:
            return 0
        return max(1, round(model_bytes * self.byte_scale))

    def model_bytes(self, wire_bytes: float) -> float:
        """Model bytes that ``wire_bytes`` real bytes stand for."""
        return wire_bytes / self.byte_scale

    def wire_rate_bytes_per_s(self, capacity_gbps: float) -> float:
        """Real bytes per wall second of a link of ``capacity_gbps`` (model Gbps; 1 Gbps = 10^9 bit/s)."""
        return capacity_gbps * GBPS_BITS / 8.0 * self.byte_scale * self.time_scale

    def model_gbps(self, wire_bytes_per_wall_s: float) -> float:
        """Model Gbps of a measured real rate (inverse of :meth:`wire_rate_bytes_per_s`)."""
        return wire_bytes_per_wall_s * 8.0 / GBPS_BITS / (self.byte_scale * self.time_scale)

    def model_rate(self, per_wall_second: float) -> float:
        """A model-quantity rate measured per wall second (e.g. Prometheus ``rate()``), per model second."""
        return per_wall_second / self.time_scale

    @classmethod
    def parse(cls, text: str) -> ScaleSettings:
        """``"time=10,bytes=0.001"`` (either key optional) → settings; ``ValueError`` naming the bad part."""
        values = {"time": DEFAULT_TIME_SCALE, "bytes": DEFAULT_BYTE_SCALE}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, raw = part.partition("=")
            if not sep or key.strip() not in values:
                raise ValueError(f"scale: expected time=X and/or bytes=Y, got {part!r}")
            try:
                values[key.strip()] = float(raw)
            except ValueError:
                raise ValueError(f"scale: {key.strip()} must be a number, got {raw!r}") from None
        return cls(time_scale=values["time"], byte_scale=values["bytes"])

    def describe(self) -> str:
        return f"time={self.time_scale:g},bytes={self.byte_scale:g}"
