"""The Prometheus observer: one batched collection per cycle, fed to every PD cluster.

Per cycle and per Prometheus URL, one query per metric family covers *all* PD clusters (``sum by
(namespace, pd_cluster, role)``), plus one for per-instance work in flight (drains) and one for the links'
egress; clusters that override a query template get their own templated queries. Queries run in a worker
thread (prometheus-api-client is synchronous), never on the event loop. A failed or empty read is reported,
never papered over: the cluster holds its last decision and turns ``Degraded``.
"""

from __future__ import annotations

import asyncio
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from prfaas_core.api.inter_dc_link import LinkMeasurementSpec
from prfaas_core.api.pd_cluster import PDClusterSpec, PrometheusQueries
from prfaas_core.names import (
    METRIC_ROUTER_REMOTE_BYTES,
    VLLM_GENERATION_TOKENS,
    VLLM_KV_CACHE_USAGE,
    VLLM_PROMPT_TOKENS,
    VLLM_REQUEST_SUCCESS,
    VLLM_REQUESTS_RUNNING,
    VLLM_REQUESTS_WAITING,
)

BY_ROLE = "namespace, pd_cluster, role"
FAMILIES: dict[str, str] = {
    "queue_depth": f"sum by ({BY_ROLE}) ({VLLM_REQUESTS_WAITING})",
    "running": f"sum by ({BY_ROLE}) ({VLLM_REQUESTS_RUNNING})",
    "kv_cache_usage": f"avg by ({BY_ROLE}) ({VLLM_KV_CACHE_USAGE})",
    "in_flight": (
        f'sum by (namespace, pd_cluster, pod) ({{__name__=~"{VLLM_REQUESTS_RUNNING}|{VLLM_REQUESTS_WAITING}"}})'
    ),
}
PREFILL_FAMILY = f"sum by (namespace, prefill_cluster) ({VLLM_REQUESTS_WAITING})"
# `and` the live counter: a series that stopped (exporter gone) still has a rate for a window, decaying as its
# last samples age out, which would read as falling egress and flip a scarce link; it must read as no data
LINK_FAMILY = (
    f"sum by (link) (rate({METRIC_ROUTER_REMOTE_BYTES}[1m])) * 8 / 1e9"
    f" and on (link) group by (link) ({METRIC_ROUTER_REMOTE_BYTES})"
)
DEMAND_RATES = {"prompt": VLLM_PROMPT_TOKENS, "requests": VLLM_REQUEST_SUCCESS, "generation": VLLM_GENERATION_TOKENS}
"""Elastic capacity's demand (vLLM's counters, as rates over the cluster's window), per cluster and role."""
DEMAND_IN_FLIGHT = f'{{__name__=~"{VLLM_REQUESTS_RUNNING}|{VLLM_REQUESTS_WAITING}"}}'
DEFAULT_QUERIES = PrometheusQueries()
DEFAULT_EGRESS_QUERY = LinkMeasurementSpec().egress_query

ClusterKey = tuple[str, str]
DemandKey = tuple[str, str, str]


@dataclass(frozen=True)
class ClusterMetrics:
    """What one PD cluster's series said this cycle (role -> value; pod -> in flight)."""

    queue_depth: Mapping[str, float]
    running: Mapping[str, float]
    kv_cache_usage: Mapping[str, float]
    in_flight: Mapping[str, float]


@dataclass
class Snapshot:
    """One cycle's reads. ``errors`` by Prometheus URL: a cluster on a failing URL gets no metrics."""

    time_s: float
    clusters: dict[ClusterKey, ClusterMetrics] = field(default_factory=dict)
    prefill_queue: dict[ClusterKey, float] = field(default_factory=dict)
    link_egress_gbps: dict[ClusterKey, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    queries: int = 0
    demand: dict[DemandKey, dict[str, dict[str, float]]] = field(default_factory=dict)
    """Elastic capacity: (label, namespace, name) -> role ('' for a site) -> rate family -> per second."""
    prefill_in_flight: dict[ClusterKey, dict[str, float]] = field(default_factory=dict)
    """Elastic capacity: a site's requests in flight per pod (its scale-in drains wait on them)."""

    def for_cluster(self, key: ClusterKey, url: str) -> tuple[ClusterMetrics | None, str | None]:
        """The cluster's metrics, or why there are none (unreachable, or no series for it)."""
        if url in self.errors:
            return None, self.errors[url]
        m = self.clusters.get(key)
        if m is None or not m.queue_depth:
            return None, f"Prometheus at {url} returned no {VLLM_REQUESTS_WAITING} series for pd_cluster={key[1]}"
        return m, None


@dataclass(frozen=True)
class ClusterQuery:
    """What the collector needs to know about one PD cluster."""

    key: ClusterKey
    url: str
    spec: PDClusterSpec


@dataclass(frozen=True)
class DemandQuery:
    """A cluster sized by the operator: its label (``pd_cluster`` or ``prefill_cluster``) and rate window."""

    label: str
    key: ClusterKey
    url: str
    window_s: int


@dataclass(frozen=True)
class LinkQuery:
    key: ClusterKey
    url: str
    measurement: LinkMeasurementSpec


def _templated(template: str, namespace: str, pd_cluster: str, role: str, window_s: int) -> str:
    return string.Template(template).safe_substitute(
        namespace=namespace, pd_cluster=pd_cluster, role=role, window=f"{window_s}s"
    )


class PrometheusCollector:
    """Runs a cycle's queries; one PrometheusConnect per URL, kept for the process's life."""

    def __init__(self, timeout_s: float = 5.0) -> None:
        self.timeout_s = timeout_s
        self._clients: dict[str, PrometheusConnect] = {}
        self.queries_total = 0

    def _client(self, url: str) -> PrometheusConnect:
        if url not in self._clients:
            self._clients[url] = PrometheusConnect(
                url=url, disable_ssl=False, retry=Retry(total=0), timeout=self.timeout_s
            )
        return self._clients[url]

    def _query(self, snap: Snapshot, url: str, promql: str) -> list[tuple[dict[str, str], float]]:
        snap.queries += 1
        self.queries_total += 1
        result = self._client(url).custom_query(promql)
        out = []
        for series in result or []:
            try:
                out.append((dict(series.get("metric") or {}), float(series["value"][1])))
            except (KeyError, IndexError, TypeError, ValueError):
                continue
        return out

    async def collect(
        self,
        now_s: float,
        clusters: Iterable[ClusterQuery],
        links: Iterable[LinkQuery] = (),
        prefill_urls: Iterable[str] = (),
        demand: Iterable[DemandQuery] = (),
    ) -> Snapshot:
        clusters, links = list(clusters), list(links)
        return await asyncio.to_thread(self._collect, now_s, clusters, links, set(prefill_urls), list(demand))

    def _collect(
        self,
        now_s: float,
        clusters: list[ClusterQuery],
        links: list[LinkQuery],
        prefill_urls: set[str],
        demand: list[DemandQuery] | None = None,
    ) -> Snapshot:
        snap = Snapshot(now_s)
        by_url: dict[str, list[ClusterQuery]] = {}
        for c in clusters:
            by_url.setdefault(c.url, []).append(c)
        for url in sorted(set(by_url) | {link.url for link in links} | prefill_urls):
            try:
                self._collect_url(
                    snap, url, by_url.get(url, []), [lk for lk in links if lk.url == url], url in prefill_urls
                )
            except Exception as exc:
                snap.errors[url] = f"Prometheus at {url} failed: {type(exc).__name__}: {exc}"[:500]
        for url in sorted({d.url for d in demand or ()} - set(snap.errors)):
            try:
                self._collect_demand(snap, url, [d for d in demand or () if d.url == url])
            except Exception as exc:
                snap.errors[url] = f"Prometheus at {url} failed: {type(exc).__name__}: {exc}"[:500]
        return snap

    def _collect_demand(self, snap: Snapshot, url: str, demand: list[DemandQuery]) -> None:
        """One query per (label, window, family) for every sized cluster; a site's in-flight per pod."""
        groups: dict[tuple[str, int], set[ClusterKey]] = {}
        for d in demand:
            groups.setdefault((d.label, d.window_s), set()).add(d.key)
        for (label, window_s), keys in sorted(groups.items()):
            for key in keys:
                snap.demand[(label, *key)] = {}
            for family, metric in DEMAND_RATES.items():
                promql = f"sum by (namespace, {label}, role) (rate({metric}[{window_s}s]))"
                for labels, value in self._query(snap, url, promql):
                    key = (labels.get("namespace", ""), labels.get(label, ""))
                    if key in keys:
                        roles = snap.demand[(label, *key)]
                        roles.setdefault(labels.get("role", ""), {})[family] = value
        if any(d.label == "prefill_cluster" for d in demand):
            promql = f"sum by (namespace, prefill_cluster, pod) ({DEMAND_IN_FLIGHT})"
            for labels, value in self._query(snap, url, promql):
                key = (labels.get("namespace", ""), labels.get("prefill_cluster", ""))
                snap.prefill_in_flight.setdefault(key, {})[labels.get("pod", "")] = value

    def _collect_url(
        self, snap: Snapshot, url: str, clusters: list[ClusterQuery], links: list[LinkQuery], prefill: bool
    ) -> None:
        raw: dict[str, dict[ClusterKey, dict[str, float]]] = {f: {} for f in FAMILIES}
        wanted = {c.key for c in clusters}
        if clusters:
            for family, promql in FAMILIES.items():
                label = "pod" if family == "in_flight" else "role"
                for metric, value in self._query(snap, url, promql):
                    key = (metric.get("namespace", ""), metric.get("pd_cluster", ""))
                    if key in wanted and label in metric:
                        raw[family].setdefault(key, {})[metric[label]] = value
        for c in clusters:
            if c.spec.prometheus.queries != DEFAULT_QUERIES:
                self._custom(snap, url, c, raw)
            snap.clusters[c.key] = ClusterMetrics(
                queue_depth=raw["queue_depth"].get(c.key, {}),
                running=raw["running"].get(c.key, {}),
                kv_cache_usage=raw["kv_cache_usage"].get(c.key, {}),
                in_flight=raw["in_flight"].get(c.key, {}),
            )
        if prefill:
            for metric, value in self._query(snap, url, PREFILL_FAMILY):
                snap.prefill_queue[(metric.get("namespace", ""), metric.get("prefill_cluster", ""))] = value
        if any(lk.measurement.egress_query == DEFAULT_EGRESS_QUERY for lk in links):
            by_link = {m.get("link", ""): v for m, v in self._query(snap, url, LINK_FAMILY)}
            for lk in links:
                if lk.measurement.egress_query == DEFAULT_EGRESS_QUERY and lk.key[1] in by_link:
                    snap.link_egress_gbps[lk.key] = by_link[lk.key[1]]
        for lk in links:
            if lk.measurement.egress_query != DEFAULT_EGRESS_QUERY:
                promql = string.Template(lk.measurement.egress_query).safe_substitute(link=lk.key[1])
                values = [v for _, v in self._query(snap, url, promql)]
                if values:
                    snap.link_egress_gbps[lk.key] = sum(values)

    def _custom(
        self, snap: Snapshot, url: str, c: ClusterQuery, raw: dict[str, dict[ClusterKey, dict[str, float]]]
    ) -> None:
        """Templated per-cluster queries for a cluster that overrides the defaults."""
        q = c.spec.prometheus.queries
        window = c.spec.prometheus.window_seconds
        for family, template in (
            ("queue_depth", q.queue_depth),
            ("running", q.running),
            ("kv_cache_usage", q.kv_cache_usage),
        ):
            if template == getattr(DEFAULT_QUERIES, family):
                continue
            raw[family].pop(c.key, None)
            for role in ("prefill", "decode"):
                values = [v for _, v in self._query(snap, url, _templated(template, *c.key, role, window))]
                if values:
                    raw[family].setdefault(c.key, {})[role] = sum(values)
