"""Circuit breaker for a remote dependency (the PrFaaS gateway, the link): a small state machine.

closed --(``failure_threshold`` consecutive failures, or :meth:`Breaker.trip`)--> open --(``open_s`` elapsed)-->
half-open --(a probe succeeds)--> closed;  half-open --(a probe fails)--> open again.

A trip is the shell's own judgement that the remote is down (a router: its gateway's status endpoint stopped
answering), which stops remote use before any request has paid for a failed call; the breaker opens then, so it
(and the alert on it) says what the router does.

While open, requests skip the remote side and prefill locally (no request lost). Asking whether the remote
*could* be used (:meth:`Breaker.available`) never changes the state: only a request that will actually use
the remote takes a probe (:meth:`Breaker.acquire`), at most ``max_probes`` at a time, and every probe's
outcome comes back — success, failure, or :meth:`Breaker.cancelled` (the request went away: the slot is
freed, no verdict). A probe whose outcome never arrives frees its slot after ``probe_timeout_s``, so no lost
report can leave the breaker stuck. Time is a parameter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

BreakerMode = Literal["closed", "open", "half-open"]


@dataclass(frozen=True)
class BreakerParams:
    failure_threshold: int = 5
    open_s: float = 10.0
    max_probes: int = 1
    """Probes in flight at once while half-open."""
    probe_timeout_s: float = 60.0
    """A probe that has not reported back after this long no longer holds its slot."""


@dataclass(frozen=True)
class Breaker:
    mode: BreakerMode = "closed"
    failures: int = 0
    opened_at_s: float = 0.0
    probes: tuple[float, ...] = ()
    """Start times of the probes in flight (half-open only)."""
    reason: str = "closed: no failures"

    def _live(self, now_s: float, params: BreakerParams) -> tuple[float, ...]:
        return tuple(t for t in self.probes if now_s - t < params.probe_timeout_s)

    def available(self, now_s: float, params: BreakerParams) -> bool:
        """Whether a request *could* use the remote now (a probe slot is free); changes nothing."""
        if self.mode == "closed":
            return True
        if self.mode == "open":
            return now_s - self.opened_at_s >= params.open_s
        return len(self._live(now_s, params)) < params.max_probes

    def acquire(self, now_s: float, params: BreakerParams) -> tuple[bool, Breaker]:
        """A request that *will* use the remote asks; (allowed, the state after). While not closed, an allowed
        request is a probe and must report back (success, failure or cancelled)."""
        if not self.available(now_s, params):
            return False, self
        if self.mode == "closed":
            return True, self
        probes = (*self._live(now_s, params), now_s)
        return True, Breaker("half-open", self.failures, self.opened_at_s, probes, "half-open: probing")

    def on_success(self) -> Breaker:
        return Breaker(reason="closed: last call succeeded")

    def on_failure(self, now_s: float, params: BreakerParams, why: str) -> Breaker:
        if self.mode == "half-open":
            return Breaker("open", self.failures + 1, now_s, (), f"open: probe failed ({why})")
        if self.mode == "open":
            return replace(self, failures=self.failures + 1)
        failures = self.failures + 1
        if failures >= params.failure_threshold:
            return Breaker("open", failures, now_s, (), f"open: {failures} consecutive failures, last: {why}")
        return replace(self, failures=failures, reason=f"closed: {failures} consecutive failure(s), last: {why}")

    def trip(self, now_s: float, why: str) -> Breaker:
        """Open now (the remote is known to be down); an open breaker stays as it is."""
        if self.mode == "open":
            return self
        return Breaker("open", self.failures, now_s, (), f"open: {why}")

    def cancelled(self, started_s: float) -> Breaker:
        """A probe started at ``started_s`` ended without a verdict (the client went away): its slot is free."""
        if self.mode != "half-open" or started_s not in self.probes:
            return self
        probes = list(self.probes)
        probes.remove(started_s)
        return replace(self, probes=tuple(probes))

    @property
    def is_open(self) -> bool:
        return self.mode != "closed"


@dataclass(frozen=True)
class Transition:
    """One change of a breaker's mode (a shell logs it and exports it)."""

    remote: str
    before: BreakerMode
    after: BreakerMode
    reason: str


class BreakerBoard:
    """The breakers of a shell's remote sides, consulted and updated through one interface (the request
    path asks, the legs report; nothing else writes them). Mode changes queue up as :class:`Transition` s
    until the shell takes them (:meth:`take_transitions`)."""

    def __init__(self) -> None:
        self._breakers: dict[str, Breaker] = {}
        self._identity: dict[str, object] = {}
        self._transitions: list[Transition] = []

    def ensure(self, names: Iterable[str] | Mapping[str, object]) -> None:
        """Add a closed breaker for each new name. Given a mapping name -> identity (its URL, its link), a
        remote whose identity changed starts closed again, and remotes no longer named are forgotten; the
        others keep their state."""
        if isinstance(names, Mapping):
            for gone in set(self._breakers) - set(names):
                del self._breakers[gone]
                self._identity.pop(gone, None)
            for name, identity in names.items():
                if name in self._identity and self._identity[name] != identity:
                    self._set(name, Breaker(reason="closed: the remote changed"))
                self._identity[name] = identity
                self._breakers.setdefault(name, Breaker())
            return
        for name in names:
            self._breakers.setdefault(name, Breaker())

    def get(self, name: str) -> Breaker:
        return self._breakers.get(name, Breaker())

    def _set(self, name: str, new: Breaker) -> None:
        old = self.get(name)
        self._breakers[name] = new
        if old.mode != new.mode:
            self._transitions.append(Transition(name, old.mode, new.mode, new.reason))

    def available(self, name: str, now_s: float, params: BreakerParams) -> bool:
        """Whether a request could use ``name`` now; changes nothing."""
        breaker = self._breakers.get(name)
        return breaker is None or breaker.mode == "closed" or breaker.available(now_s, params)

    def acquire(self, name: str, now_s: float, params: BreakerParams) -> float | None:
        """A request that will use ``name``: None if refused; else the probe's ticket (its start time), to
        hand back with the outcome (a closed breaker's ticket is ignored by :meth:`cancelled`)."""
        breaker = self._breakers.get(name)
        if breaker is not None and breaker.mode == "closed":  # (every request's path: nothing changes)
            return now_s
        allowed, new = (breaker or Breaker()).acquire(now_s, params)
        if not allowed:
            return None
        self._set(name, new)
        return now_s

    def allows(self, name: str, now_s: float, params: BreakerParams) -> bool:
        """Acquire and say whether it was allowed (the caller reports the outcome)."""
        return self.acquire(name, now_s, params) is not None

    def succeeded(self, name: str) -> None:
        self._set(name, self.get(name).on_success())

    def failed(self, name: str, now_s: float, params: BreakerParams, why: str) -> None:
        self._set(name, self.get(name).on_failure(now_s, params, why))

    def tripped(self, name: str, now_s: float, why: str) -> None:
        self._set(name, self.get(name).trip(now_s, why))

    def cancelled(self, name: str, ticket: float) -> None:
        self._set(name, self.get(name).cancelled(ticket))

    def is_open(self, name: str) -> bool:
        breaker = self._breakers.get(name)
        return breaker is not None and breaker.is_open

    def reason(self, name: str) -> str:
        return self.get(name).reason

    def take_transitions(self) -> list[Transition]:
        out, self._transitions = self._transitions, []
        return out
