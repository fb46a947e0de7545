"""The link's Prometheus metrics (label ``link``), on a registry of its own.

``prfaas_link_egress_bytes_total`` counts *model* bytes delivered towards the decode side (wire bytes ÷
``byte_scale``; see :mod:`prfaas_core.launch.emulation`), the series routers and the operator read;
``prfaas_link_wire_bytes_total`` the real bytes. ``prfaas_link_utilization_ratio`` is the egress over the last
second divided by the capacity in force (both in wire terms, so it is the same ratio in model terms).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from prfaas_core import names

CONTENT_TYPE = CONTENT_TYPE_LATEST
UTILISATION_WINDOW_S = 1.0


class RecentRate:
    """Bytes per second over a sliding window of wall time."""

    def __init__(self, now: Callable[[], float], window_s: float = UTILISATION_WINDOW_S) -> None:
        self._now = now
        self.window_s = window_s
        self._events: deque[tuple[float, int]] = deque()
        self._sum = 0

    def add(self, nbytes: int) -> None:
        self._events.append((self._now(), nbytes))
        self._sum += nbytes
        self._prune()

    def _prune(self) -> None:
        horizon = self._now() - self.window_s
        while self._events and self._events[0][0] < horizon:
            self._sum -= self._events.popleft()[1]

    def bytes_per_s(self) -> float:
        self._prune()
        return self._sum / self.window_s


class EgressWindows:
    """The relay's own 1-s *model* windows of delivered model bytes, keyed by ``floor(model time)`` of each
    chunk's serialisation on the emulated wire, on the machine's monotonic clock (so several relays' windows
    line up, summing them gives the link's, and a relay process starved of CPU does not bunch them)."""

    def __init__(self, keep: int = 7200) -> None:
        self.keep = keep
        self._windows: dict[int, float] = {}

    def add(self, model_s: float, model_bytes: float) -> None:
        key = int(model_s // 1)
        self._windows[key] = self._windows.get(key, 0.0) + model_bytes
        if len(self._windows) > self.keep:
            del self._windows[min(self._windows)]

    def since(self, first: int) -> dict[int, float]:
        return {k: v for k, v in self._windows.items() if k >= first}


class _Utilisation(Collector):
    def __init__(self, link: str, value: Callable[[], float]) -> None:
        self.link = link
        self.value = value

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily(
            names.METRIC_LINK_UTILIZATION, "Egress over the last second / capacity in force.", labels=["link"]
        )
        g.add_metric([self.link], self.value())
        yield g


class LinkMetrics:
    def __init__(self, link: str, utilisation: Callable[[], float]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        lb = ("link",)
        self.egress = Counter(names.METRIC_LINK_EGRESS_BYTES, "KV model bytes delivered.", lb, registry=r).labels(link)
        self.wire = Counter(names.METRIC_LINK_WIRE_BYTES, "Real bytes delivered.", lb, registry=r).labels(link)
        self.reverse = Counter(names.METRIC_LINK_REVERSE_BYTES, "Model bytes upstream.", lb, registry=r).labels(link)
        self.active = Gauge(names.METRIC_LINK_ACTIVE_TRANSFERS, "Open relayed connections.", lb, registry=r).labels(
            link
        )
        self.connections = Counter(names.METRIC_LINK_CONNECTIONS, "Accepted connections.", lb, registry=r).labels(link)
        self.dropped = Counter(
            names.METRIC_LINK_DROPPED, "Connections cut by faults or errors.", (*lb, "reason"), registry=r
        )
        self.capacity = Gauge(names.METRIC_LINK_CAPACITY_GBPS, "Capacity in force, model Gbps.", lb, registry=r).labels(
            link
        )
        self.rtt = Gauge(names.METRIC_LINK_RTT_SECONDS, "Round-trip time, model seconds.", lb, registry=r).labels(link)
        r.register(_Utilisation(link, utilisation))
        self.link = link

    def drop(self, reason: str) -> None:
        self.dropped.labels(self.link, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
