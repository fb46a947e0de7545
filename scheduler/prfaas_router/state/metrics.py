"""The router's Prometheus metrics, in a registry of its own (no process-global state), and the one reader of
Prometheus text exposition that every scraper of ours goes through."""

from __future__ import annotations

import functools
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from prfaas_core import names
from prfaas_core.api.common import SloSpec
from prfaas_core.request.slo import ttft_objective_s

# --- Reading Prometheus text exposition: the one parser every scraper of ours goes through (the router's
# refresher reading engines and links, the CLI's local loop, ``prfaas up`` and the load driver).


def sample_sums(text: str, names: Collection[str], labels: Mapping[str, str] | None = None) -> dict[str, float]:
    """Per sample name in ``names`` (a counter's ``_total`` name is its sample's), the sum of its samples whose
    labels include ``labels``; a name with no such sample is absent.

    Only the lines that start with a wanted name reach the parser: an engine exposes hundreds of samples (vLLM's
    histograms), the router reads two, and parsing them all took ~28 % of the router's CPU under load (py-spy),
    in slices of the event loop that every relayed stream waited for."""
    wanted = tuple(names)
    if not wanted:
        return {}
    lines = [line for line in text.splitlines() if line.startswith(wanted)]
    out: dict[str, float] = {}
    if not lines:
        return out
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            if sample.name in names and (labels is None or all(sample.labels.get(k) == v for k, v in labels.items())):
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def sums_by_labels(text: str, wanted: Mapping[str, tuple[str, ...]]) -> dict[str, dict[tuple[str, ...], float]]:
    """Per sample name in ``wanted``, the sum of its samples per value of its labels ``wanted[name]`` (a label a
    sample lacks counts as ""); a name with no sample is absent. The same line filter as :func:`sample_sums`."""
    lines = [line for line in text.splitlines() if line.startswith(tuple(wanted))]
    out: dict[str, dict[tuple[str, ...], float]] = {}
    if not lines:
        return out
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            keys = wanted.get(sample.name)
            if keys is not None:
                into = out.setdefault(sample.name, {})
                values = tuple(sample.labels.get(k, "") for k in keys)
                into[values] = into.get(values, 0.0) + sample.value
    return out


def sample_sum(text: str, name: str, labels: Mapping[str, str] | None = None) -> float | None:
    """The sum of the samples named ``name`` whose labels include ``labels`` (None: there are none)."""
    return sample_sums(text, (name,), labels).get(name)


# --- The router's Prometheus metrics, in a registry of its own (no process-global state). With ``prfaas router
# --workers N`` each worker writes its series into the folder named by PROMETHEUS_MULTIPROC_DIR (prometheus_client's
# multiprocess mode) and a scrape, whichever worker it reaches, reads them all: counters and histograms summed, a
# gauge by its mode (in flight, open connections, workers: the live workers' sum; health, readiness: their minimum;
# the rest, each worker's view of one shared thing — t, a breaker, a link — their maximum).
GaugeMode = Literal["livemax", "livemin", "livesum"]


def gauge(
    name: str, doc: str, labels: Collection[str] = (), *, registry: CollectorRegistry, mode: GaugeMode = "livemax"
) -> Gauge:
    """A gauge and how the workers' values combine (:func:`exposition`)."""
    return Gauge(name, doc, labels, registry=registry, multiprocess_mode=mode)


def exposition(registry: CollectorRegistry) -> bytes:
    """What a scrape of this process answers: every worker's series when they share a multiprocess folder, else
    ``registry``'s own."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        merged = CollectorRegistry()
        MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
        return generate_latest(merged)
    return generate_latest(registry)


FAILURE_KINDS: tuple[tuple[str, str], ...] = (
    ("Timeout", "timeout"),
    ("answered 5", "remote-5xx"),
    ("answered 4", "remote-4xx"),
    ("Connect", "connect"),
    ("KV handle", "no-kv-handle"),
)
FALLBACK_REASONS: tuple[str, ...] = (*(kind for _, kind in FAILURE_KINDS), "other", "decode-kv-pull")
"""Every ``reason`` of the fallbacks counter (the router exports each at 0 from its start, so a dashboard shows 0,
not "no data", until the first fallback)."""

_LATENCY = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0)
_TPOT = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0)
_WAIT = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0, 300.0)
_DECISION = (2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3)


@dataclass
class RouterMetrics:
    """Every series of one router (or gateway) process."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter(
            names.METRIC_ROUTER_REQUESTS.removesuffix("_total"),
            "Requests answered, by route and outcome.",
            ["route", "outcome"],
            registry=r,
        )
        self.decisions = Counter(
            names.METRIC_ROUTER_ROUTE_DECISIONS.removesuffix("_total"),
            "Routing decisions, by route and why.",
            ["route", "reason"],
            registry=r,
        )
        self.threshold = gauge(names.METRIC_ROUTER_THRESHOLD_TOKENS, "Routing threshold t in force.", registry=r)
        self.threshold_min = gauge(
            names.METRIC_ROUTER_THRESHOLD_MIN_TOKENS, "t_min: the floor of the routing threshold.", registry=r
        )
        self.uncached_tokens = Histogram(
            names.METRIC_ROUTER_UNCACHED_TOKENS,
            "Uncached prompt tokens of routed requests (the observed length mix).",
            buckets=[float(b) for b in names.UNCACHED_TOKEN_BUCKETS],
            registry=r,
        )
        self.ttft = Histogram(
            names.METRIC_ROUTER_TTFT_SECONDS,
            "Time to first token, by route: the first streamed chunk, or for a non-streamed answer the end of its "
            "prefill leg (which computes the first token).",
            ["route"],
            buckets=_LATENCY,
            registry=r,
        )
        self.e2e = Histogram(
            names.METRIC_ROUTER_E2E_SECONDS, "End-to-end latency, by route.", ["route"], buckets=_LATENCY, registry=r
        )
        self.tpot = Histogram(
            names.METRIC_ROUTER_TPOT_SECONDS,
            "Time per output token of streamed answers, by route: (last chunk - first chunk) / (chunks - 1).",
            ["route"],
            buckets=_TPOT,
            registry=r,
        )
        self.fallbacks = Counter(
            names.METRIC_ROUTER_FALLBACKS.removesuffix("_total"),
            "Remote prefills that fell back to local prefill, by reason.",
            ["reason"],
            registry=r,
        )
        for reason in FALLBACK_REASONS:
            self.fallbacks.labels(reason)
        self.breaker_open = gauge(
            names.METRIC_ROUTER_BREAKER_OPEN, "1 while a remote's circuit breaker is open.", ["remote"], registry=r
        )
        self.breaker_transitions = Counter(
            names.METRIC_ROUTER_BREAKER_TRANSITIONS.removesuffix("_total"),
            "Breaker mode changes, by remote and the mode entered.",
            ["remote", "to"],
            registry=r,
        )
        self.prefill_retries = Counter(
            names.METRIC_ROUTER_PREFILL_RETRIES.removesuffix("_total"),
            "Failed local prefill legs tried once more, by where (local, remote, none) and outcome.",
            ["to", "outcome"],
            registry=r,
        )
        self.engine_healthy = gauge(
            names.METRIC_ROUTER_ENGINE_HEALTHY,
            "1 while an engine counts as healthy.",
            ["engine"],
            registry=r,
            mode="livemin",
        )
        self.probe_failures = Counter(
            names.METRIC_ROUTER_HEALTH_PROBE_FAILURES.removesuffix("_total"),
            "Failed health probes (an engine's /metrics read), by engine.",
            ["engine"],
            registry=r,
        )
        self.prefix_queries = Counter(
            names.METRIC_ROUTER_PREFIX_QUERY_TOKENS.removesuffix("_total"),
            "Prompt tokens looked up in the prefix indexes, by cluster.",
            ["cluster"],
            registry=r,
        )
        self.prefix_hits = Counter(
            names.METRIC_ROUTER_PREFIX_HIT_TOKENS.removesuffix("_total"),
            "Prompt tokens found cached, by cluster (PD: on an instance that can prefill) and cache kind.",
            ["cluster", "cache_kind"],
            registry=r,
        )
        self.prefix_unhonoured = Counter(
            names.METRIC_ROUTER_PREFIX_UNHONOURED_TOKENS.removesuffix("_total"),
            "Predicted prefix-hit tokens the engine's reported cached_tokens fell short of, by cluster.",
            ["cluster"],
            registry=r,
        )
        self.kv_event_batches = Counter(
            names.METRIC_ROUTER_KV_EVENT_BATCHES.removesuffix("_total"),
            "KV event batches received from the engines, by engine and outcome.",
            ["engine", "outcome"],
            registry=r,
        )
        self.kv_event_blocks = Counter(
            names.METRIC_ROUTER_KV_EVENT_BLOCKS.removesuffix("_total"),
            "Blocks the engines' KV events stored and removed in the exact prefix index, by engine and event.",
            ["engine", "event"],
            registry=r,
        )
        self.kv_index_blocks = gauge(
            names.METRIC_ROUTER_KV_INDEX_BLOCKS,
            "Blocks the exact prefix index holds for an engine from its KV events.",
            ["engine"],
            registry=r,
        )
        self.abandoned_kv = Counter(
            names.METRIC_ROUTER_ABANDONED_KV.removesuffix("_total"),
            "KV handles no decode pulled (the decode leg failed after the prefill), by cluster.",
            ["cluster"],
            registry=r,
        )
        self.released_kv = Counter(
            names.METRIC_ROUTER_RELEASED_KV.removesuffix("_total"),
            "Abandoned KV handles released at once through a decode instance, by cluster.",
            ["cluster"],
            registry=r,
        )
        self.ready = gauge(names.METRIC_ROUTER_READY, "1 while the router can serve.", registry=r, mode="livemin")
        self.decision_seconds = Histogram(
            names.METRIC_ROUTER_DECISION_SECONDS,
            "Time of the routing decision (policy call).",
            buckets=_DECISION,
            registry=r,
        )
        self.in_flight = gauge(names.METRIC_ROUTER_IN_FLIGHT, "Requests in flight.", registry=r, mode="livesum")
        self.workers = gauge(
            names.METRIC_ROUTER_WORKERS, "Worker processes serving the port.", registry=r, mode="livesum"
        )
        self.workers.set(1)
        self.link_egress = gauge(
            names.METRIC_ROUTER_LINK_EGRESS_GBPS, "Estimated link egress (model Gbps).", ["link"], registry=r
        )
        self.link_cap = gauge(
            names.METRIC_ROUTER_LINK_CAP_GBPS,
            "The link's cap: capacity (bounded by the available bandwidth measured) x maxUtilization (model Gbps).",
            ["link"],
            registry=r,
        )
        self.link_scarce = gauge(names.METRIC_ROUTER_LINK_SCARCE, "1 while the link is scarce.", ["link"], registry=r)
        self.link_waits = Counter(
            names.METRIC_ROUTER_LINK_WAITS.removesuffix("_total"),
            "Gateway link-window declines, by link and what the router did (waited, local).",
            ["link", "result"],
            registry=r,
        )
        self.link_wait_seconds = Histogram(
            names.METRIC_ROUTER_LINK_WAIT_SECONDS,
            "Link-window waits accepted on a gateway's decline (model seconds), by link.",
            ["link"],
            buckets=_WAIT,
            registry=r,
        )
        self.link_available = gauge(
            names.METRIC_ROUTER_LINK_AVAILABLE_GBPS,
            "The link's available bandwidth, estimated from its KV pulls' timing (model Gbps), by link.",
            ["link"],
            registry=r,
        )
        self.link_available_source = gauge(
            names.METRIC_ROUTER_LINK_AVAILABLE_SOURCE,
            "1 for the available-bandwidth estimate's current source (configured, streams, stalled), by link.",
            ["link", "source"],
            registry=r,
        )
        self.replica_peers = gauge(
            names.METRIC_ROUTER_REPLICA_PEERS,
            "Other router replicas whose PD prefill books this one heard within the expiry.",
            registry=r,
        )
        self.replica_sync = Counter(
            names.METRIC_ROUTER_REPLICA_SYNC.removesuffix("_total"),
            "Books sent to peer router replicas, by result (sent, unreachable, refused, unauthorized, self).",
            ["result"],
            registry=r,
        )
        for result in ("sent", "unreachable", "refused", "unauthorized", "self"):  # exported at 0 before the first send
            self.replica_sync.labels(result)
        self.replica_books_rejected = Counter(
            names.METRIC_ROUTER_REPLICA_BOOKS_REJECTED.removesuffix("_total"),
            "Peer books this replica refused, by reason.",
            ["reason"],
            registry=r,
        )
        for reason in names.BOOK_REJECTIONS:
            self.replica_books_rejected.labels(reason)
        self.replica_peer_prefill = gauge(
            names.METRIC_ROUTER_REPLICA_PEER_PREFILL_SECONDS,
            "The other replicas' local prefills in flight on each PD prefill instance, as last heard (predicted model "
            "seconds).",
            ["instance"],
            registry=r,
        )
        self.gateway_admissions = Counter(
            names.METRIC_GATEWAY_ADMISSIONS.removesuffix("_total"),
            "Gateway mode: remote prefills the link calendar answered, by link and result (booked, or the decline's "
            "reason).",
            ["link", "result"],
            registry=r,
        )
        self.gateway_admission_wait = Histogram(
            names.METRIC_GATEWAY_ADMISSION_WAIT_SECONDS,
            "Gateway mode: booked windows' waits before their prefill starts (model seconds), by link.",
            ["link"],
            buckets=_WAIT,
            registry=r,
        )
        self.gateway_lane_reorders = Counter(
            names.METRIC_GATEWAY_LANE_REORDERS.removesuffix("_total"),
            "Gateway mode: held prefills moved back on their lane for an earlier deadline, by link.",
            ["link"],
            registry=r,
        )
        self.gateway_link_available = gauge(
            names.METRIC_GATEWAY_LINK_AVAILABLE_GBPS,
            "Gateway mode: the available bandwidth the link calendar books under (model Gbps), by link and source.",
            ["link", "source"],
            registry=r,
        )
        self.gateway_pulls = Counter(
            names.METRIC_GATEWAY_PULLS.removesuffix("_total"),
            "Gateway mode: pulls let onto the wire that are over, by link and end (reported by the caller, or lease).",
            ["link", "end"],
            registry=r,
        )
        self.gateway_pull_hold = Histogram(
            names.METRIC_GATEWAY_PULL_HOLD_SECONDS,
            "Gateway mode: how long prefill answers were held until their pull fit on the wire (model seconds), by "
            "link.",
            ["link"],
            buckets=_WAIT,
            registry=r,
        )
        self.gateway_link_share = gauge(
            names.METRIC_GATEWAY_LINK_SHARE,
            "Gateway mode: this replica's share of the link's ceiling now (base 1 / replicas, less lent, plus "
            "borrowed), by link.",
            ["link"],
            registry=r,
        )
        self.gateway_claims_corrected = Counter(
            names.METRIC_GATEWAY_CLAIMS_CORRECTED.removesuffix("_total"),
            "Gateway mode: router claims the gateway corrected, by link and claim (kv_bytes, decode_cached, slo_ttft).",
            ["link", "claim"],
            registry=r,
        )
        self.gateway_loans = Counter(
            names.METRIC_GATEWAY_LOANS.removesuffix("_total"),
            "Gateway mode: share loans between gateway replicas, by link and result (borrowed, lent, refused, "
            "unreachable, expired, not_peer, over_bounds).",
            ["link", "result"],
            registry=r,
        )
        self.gateway_site_cap = gauge(
            names.METRIC_GATEWAY_SITE_CAP_GBPS,
            "Gateway mode, fleet: the site's egress cap as this replica books it (model Gbps), by site.",
            ["site"],
            registry=r,
        )
        self.gateway_site_demand = gauge(
            names.METRIC_GATEWAY_SITE_DEMAND_GBPS,
            "Gateway mode, fleet: each link's demand on its site (KV offered over the last 10 model s, Gbps), by "
            "site and link.",
            ["site", "link"],
            registry=r,
        )
        self.gateway_site_share = gauge(
            names.METRIC_GATEWAY_SITE_SHARE_GBPS,
            "Gateway mode, fleet: each link's share of its site's egress cap now (the whole cap while the demands "
            "fit under it, else max-min fair; model Gbps), by site and link.",
            ["site", "link"],
            registry=r,
        )
        self.remote_bytes = Counter(
            names.METRIC_ROUTER_REMOTE_BYTES.removesuffix("_total"),
            "KV bytes (the whole blocks of the remote engine's reported prompt tokens the decode lacks, plus a "
            "hybrid's recurrent state) of the remote prefills admitted, by link.",
            ["link"],
            registry=r,
        )
        self.ttft_slo = Counter(
            names.METRIC_ROUTER_TTFT_SLO.removesuffix("_total"),
            "Requests whose TTFT met or missed their own objective (RouterConfig.slo), by route and result.",
            ["route", "result"],
            registry=r,
        )
        self.ttft_slo_objective = gauge(
            names.METRIC_ROUTER_TTFT_SLO_OBJECTIVE,
            "The SLO's objective ratio (fraction of requests that must meet their TTFT objective).",
            registry=r,
        )
        self.gateway_egress = Counter(
            names.METRIC_GATEWAY_KV_EGRESS_BYTES.removesuffix("_total"),
            "Gateway mode: KV bytes (the whole blocks of the engine's reported prompt tokens the decode lacks, plus a "
            "hybrid's recurrent state) of the remote prefills served, by link.",
            ["link"],
            registry=r,
        )
        # the series every request touches, their children cached: prometheus_client's labels() takes a lock and
        # checks the values on every call (bounded: routes, outcomes, kinds)
        self.requests_by = functools.cache(self.requests.labels)
        self.decisions_by = functools.cache(self.decisions.labels)
        self.e2e_by = functools.cache(self.e2e.labels)
        self.prefix_queries_by = functools.cache(self.prefix_queries.labels)
        self.prefix_hits_by = functools.cache(self.prefix_hits.labels)

    def drop_router_series(self) -> None:
        """Gateway mode routes nothing: unregister the router's own series (``t``, ``t_min``, the fallbacks, the
        length mix, the decision time, the SLO objective), which a gateway would otherwise export as 0 and draw as a
        false ``t = 0`` instance on the dashboard's per-instance panels."""
        for series in (
            self.threshold,
            self.threshold_min,
            self.fallbacks,
            self.uncached_tokens,
            self.decision_seconds,
            self.ttft_slo_objective,
        ):
            self.registry.unregister(series)


def judge_ttft(metrics: RouterMetrics, slo: SloSpec | None, route: str, ttft_s: float, prompt_tokens: int) -> None:
    """Observe a request's TTFT, and count it against its own objective when the router has the SLO."""
    metrics.ttft.labels(route).observe(ttft_s)
    if slo is not None:
        result = "met" if ttft_s <= ttft_objective_s(slo, prompt_tokens) else "missed"
        metrics.ttft_slo.labels(route, result).inc()
