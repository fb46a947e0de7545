"""An engine's load as the router's last scrape saw it, and what of an instance's routing view stands between two
scrapes (:func:`standing`, a row per instance): built once per refresh, so that a routing decision adds only what
moves per request (:func:`instance_views`: the router's own books, its peers' and the request's prefix hits) instead
of recomputing every instance's load."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from .routing import InstanceView


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


Row = tuple[str, float, float, bool, bool]
"""An instance as it stands: (name, requests no book shows, its slowness penalty in model seconds, healthy,
draining)."""


def standing(
    engines: Mapping[str, EngineLoad],
    tier: Iterable[str],
    draining: frozenset[str],
    slow_probe_s: float,
    time_scale: float,
) -> tuple[Row, ...]:
    """The rows of one tier's instances, in order: a slow engine's penalty is how much its last probe exceeded
    ``slow_probe_s`` (wall), in model time."""
    out = []
    for name in tier:
        load = engines.get(name, IDLE)
        out.append(
            (name, load.others, max(0.0, load.probe_s - slow_probe_s) * time_scale, load.healthy, name in draining)
        )
    return tuple(out)


def instance_views(
    rows: Sequence[Row],
    work_s: Callable[[str, float], float],
    hits: Mapping[str, int],
    active: Mapping[str, int],
    slots: int,
    exclude: frozenset[str],
    waits: list[float] | None = None,
) -> list[InstanceView]:
    """Per request only what moves, over the standing rows: an instance's queued work (``work_s(name, others)``:
    the books, its peers', the requests no book shows) plus its slowness penalty, the request's prefix hit on it,
    its active decodes. ``waits`` collects the queued work of the healthy, non-draining ones."""
    out = []
    for name, others, slow_s, healthy, draining in rows:
        work = work_s(name, others)
        if waits is not None and healthy and not draining:
            waits.append(work)
        excluded = name in exclude
        out.append(
            InstanceView(
                name, work + slow_s, hits.get(name, 0), active.get(name, 0), slots, healthy and not excluded, draining
            )
        )
    return out
