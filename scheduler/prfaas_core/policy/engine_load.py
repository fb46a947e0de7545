"""An engine's load as the router's last scrape saw it, and what of an instance's routing view stands between two
scrapes (:func:`standing`): built once per refresh, so that a routing decision adds only what moves per request
(the router's own books, its peers' and the request's prefix hits) instead of recomputing every instance's load."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class EngineLoad:
    healthy: bool = True
    waiting: float = 0.0
    running: float = 0.0
    probe_s: float = 0.0
    """How long its last health probe took (a slow engine is deprioritised by it, not declared dead)."""
    own: int = 0
    """This router's own prefills, and those of the replicas whose books it holds, that the engine may have counted
    in ``waiting + running`` at that scrape (those in flight when it began, and those started while it ran): the
    rest is work no book shows (replicas not heard from, other clients)."""

    @property
    def others(self) -> float:
        """Requests the engine reported that no book shows (each costs the mean prefill time)."""
        return max(0.0, self.waiting + self.running - self.own)


IDLE = EngineLoad()
"""An engine the last scrape did not cover."""


def standing(
    engines: Mapping[str, EngineLoad],
    names: Iterable[str],
    draining: Iterable[str],
    slow_probe_s: float,
    time_scale: float,
) -> dict[str, tuple[float, float, bool, bool]]:
    """Instance -> (requests no book shows, its slowness penalty in model seconds, healthy, draining): a slow
    engine's penalty is how much its last probe exceeded ``slow_probe_s`` (wall), in model time."""
    gone = frozenset(draining)
    out = {}
    for name in names:
        load = engines.get(name, IDLE)
        out[name] = (load.others, max(0.0, load.probe_s - slow_probe_s) * time_scale, load.healthy, name in gone)
    return out
