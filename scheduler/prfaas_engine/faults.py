"""Fault knobs for reliability tests of routers and operators, set at runtime through ``POST /admin/faults``.

* ``slow_factor`` ≥ 1 multiplies every prefill and decode step (a throttled or noisy instance);
* ``error_rate`` ∈ [0, 1]: that fraction of inference requests is answered with HTTP 500;
* ``drop_mid_stream`` ∈ [0, 1]: that fraction of streamed responses is cut (TCP connection aborted) after
  the first token;
* ``die``: the engine stops answering at once — the CLI process exits with status 137 (as if SIGKILLed);
  an in-process engine aborts every connection and refuses new ones.
"""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field


class FaultSettings(BaseModel):
    """Current fault knobs (all off by default)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    slow_factor: float = Field(default=1.0, ge=1.0, le=1e6, description="Multiplier on step times.")
    error_rate: float = Field(default=0.0, ge=0.0, le=1.0, description="Fraction answered with HTTP 500.")
    drop_mid_stream: float = Field(default=0.0, ge=0.0, le=1.0, description="Fraction of streams cut.")
    die: bool = Field(default=False, description="Stop answering at once.")


class FaultInjector:
    """Draws the random faults from its own generator (seedable, so tests are repeatable)."""

    def __init__(self, seed: int | None = None) -> None:
        self.settings = FaultSettings()
        self._rng = random.Random(seed)

    def update(self, changes: dict[str, object]) -> FaultSettings:
        merged = {**self.settings.model_dump(), **changes}
        self.settings = FaultSettings.model_validate(merged)
        return self.settings

    def inject_error(self) -> bool:
        rate = self.settings.error_rate
        return rate > 0 and self._rng.random() < rate

    def drop_stream(self) -> bool:
        rate = self.settings.drop_mid_stream
        return rate > 0 and self._rng.random() < rate
