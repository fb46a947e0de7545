"""Circuit breaker for a remote dependency (the PrFaaS gateway, the link): a small state machine.

closed --(``failure_threshold`` consecutive failures)--> open --(``open_s`` elapsed)--> half-open
half-open --(probe succeeds)--> closed;  half-open --(probe fails)--> open again.

While open, requests skip the remote side and prefill locally (no request lost); in half-open one request at
a time probes it. Time is a parameter.
"""

from __future__ import annotations

from collections.abc import Iterable
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


class BreakerBoard:
    """The breakers of a shell's remote sides, consulted and updated through one interface (the request
    path asks, the legs report; nothing else writes them)."""

    def __init__(self) -> None:
        self._breakers: dict[str, Breaker] = {}

    def ensure(self, names: Iterable[str]) -> None:
        """Add a closed breaker for each new name (those that remain keep their state)."""
        for name in names:
            self._breakers.setdefault(name, Breaker())

    def get(self, name: str) -> Breaker:
        return self._breakers.get(name, Breaker())

    def allows(self, name: str, now_s: float, params: BreakerParams) -> bool:
        """Whether a request may use ``name`` now (an open breaker past its time turns half-open here)."""
        allowed, self._breakers[name] = self.get(name).allows(now_s, params)
        return allowed

    def succeeded(self, name: str) -> None:
        self._breakers[name] = self.get(name).on_success()

    def failed(self, name: str, now_s: float, params: BreakerParams, why: str) -> None:
        self._breakers[name] = self.get(name).on_failure(now_s, params, why)

    def is_open(self, name: str) -> bool:
        breaker = self._breakers.get(name)
        return breaker is not None and breaker.is_open

    def reason(self, name: str) -> str:
        return self.get(name).reason
