"""Engine health over consecutive probes: an engine is unhealthy only after ``unhealthy_after_failures`` failed
probes in a row (one slow or lost read does not take it out), and healthy again at its next good probe. While
it is still counted healthy between failures, its last good load is kept. An engine never seen answering is
unhealthy. Each change is queued as a transition for the refresher's log line.

Slowness is judged the same way: an engine's ``probe_s`` is the fastest of its last ``SLOW_PROBES`` good probes, so
an engine slow at every probe is deprioritised while one slow read (the engine busy with a prefill just then, or
the router's own loop late on a loaded machine) does not push a request off the instance that holds its prefix."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

from .runtime import EngineLoad

SLOW_PROBES = 3
"""Good probes in a row an engine must be slow at before its slowness counts."""


@dataclass
class HealthBook:
    _failures: dict[str, int] = field(default_factory=dict)
    _last: dict[str, EngineLoad] = field(default_factory=dict)
    _healthy: dict[str, bool] = field(default_factory=dict)
    _transitions: list[tuple[str, bool, str]] = field(default_factory=list)
    _durations: dict[str, deque[float]] = field(default_factory=dict)

    def _set(self, name: str, healthy: bool, why: str) -> None:
        before = self._healthy.get(name)
        self._healthy[name] = healthy
        if before != healthy and (before is not None or not healthy):
            self._transitions.append((name, healthy, why))

    def probed(self, name: str, load: EngineLoad, seconds: float) -> EngineLoad:
        """A good probe that took ``seconds``; the load it returns carries the fastest of the last few."""
        self._failures[name] = 0
        recent = self._durations.setdefault(name, deque(maxlen=SLOW_PROBES))
        recent.append(seconds)
        load = replace(load, healthy=True, probe_s=min(recent))
        self._last[name] = load
        self._set(name, True, f"probe answered in {seconds:.3f} s")
        return load

    def failed(self, name: str, why: str, threshold: int) -> EngineLoad:
        """A failed probe: still the last good load until ``threshold`` failures in a row."""
        fails = self._failures[name] = self._failures.get(name, 0) + 1
        last = self._last.get(name)
        if last is not None and fails < threshold:
            return last
        self._set(name, False, f"{fails} consecutive failed probe(s), last: {why}")
        return EngineLoad(healthy=False)

    def healthy(self, name: str) -> bool:
        return self._healthy.get(name, False)

    def take_transitions(self) -> list[tuple[str, bool, str]]:
        out, self._transitions = self._transitions, []
        return out
