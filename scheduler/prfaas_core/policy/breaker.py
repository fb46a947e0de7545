"""Circuit breaker for a remote dependency (the PrFaaS gateway, the link): a small state machine.

closed --(``failure_threshold`` consecutive failures)--> open --(``open_s`` elapsed)--> half-open
half-open --(probe succeeds)--> closed;  half-open --(probe fails)--> open again.

While open, requests skip the remote side and prefill locally (no request lost); in half-open one request at
a time probes it. Time is a parameter.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

BreakerMode = Literal["closed", "open", "half-open"]


@dataclass(frozen=True)
class BreakerParams:
    failure_threshold: int = 5
    open_s: float = 10.0


@dataclass(frozen=True)
class Breaker:
    mode: BreakerMode = "closed"
    failures: int = 0
    opened_at_s: float = 0.0
    probing: bool = False
    reason: str = "closed: no failures"

    def allows(self, now_s: float, params: BreakerParams) -> tuple[bool, Breaker]:
        """Whether a request may use the remote side now (and the state after asking)."""
        if self.mode == "closed":
            return True, self
        if self.mode == "open":
            if now_s - self.opened_at_s < params.open_s:
                return False, self
            return True, replace(self, mode="half-open", probing=True, reason="half-open: probing")
        if self.probing:
            return False, self
        return True, replace(self, probing=True)

    def on_success(self) -> Breaker:
        return Breaker(reason="closed: last call succeeded")

    def on_failure(self, now_s: float, params: BreakerParams, why: str) -> Breaker:
        if self.mode == "half-open":
            return Breaker("open", self.failures + 1, now_s, False, f"open: probe failed ({why})")
        failures = self.failures + 1
        if failures >= params.failure_threshold:
            return Breaker("open", failures, now_s, False, f"open: {failures} consecutive failures, last: {why}")
        return replace(self, failures=failures, reason=f"closed: {failures} consecutive failure(s), last: {why}")

    @property
    def is_open(self) -> bool:
        return self.mode != "closed"
