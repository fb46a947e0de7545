"""The engine's Prometheus metrics: vLLM's names, types, labels and buckets, on a registry of its own.

Names follow vLLM v1 (the ``vllm:`` prefix, labels ``model_name`` and ``engine``; ``engine="0"`` is also what
vllm-router 0.1.17 counts to discover data-parallel ranks). Values are model quantities (see
:mod:`prfaas_core.launch.emulation`): histograms observe model seconds, byte counters count model bytes.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from prfaas_core import names

TTFT_BUCKETS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5)
TTFT_BUCKETS += (5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS: tuple[float, ...] = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
TPOT_BUCKETS += (7.5, 10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS: tuple[float, ...] = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0)
LATENCY_BUCKETS += (60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
QUEUE_BUCKETS = (0.0, 0.01, 0.05, 0.1, 0.25, *LATENCY_BUCKETS)
CONTENT_TYPE = CONTENT_TYPE_LATEST
LABELS = ("model_name", "engine")
NIXL_BYTES_BUCKETS = tuple(float(1 << k) for k in range(20, 36, 2))


class EngineMetrics:
    """All series of one engine; ``render()`` gives the Prometheus text exposition."""

    def __init__(self, model_name: str, engine_index: str = "0") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        lv = (model_name, engine_index)
        self.running = Gauge(names.VLLM_REQUESTS_RUNNING, "Requests in the running batch.", LABELS, registry=r)
        self.running_l = self.running.labels(*lv)
        self.waiting = Gauge(names.VLLM_REQUESTS_WAITING, "Requests waiting (incl. for remote KV).", LABELS, registry=r)
        self.waiting_l = self.waiting.labels(*lv)
        self.kv_usage = Gauge(names.VLLM_KV_CACHE_USAGE, "KV-cache usage, 1 = 100 %.", LABELS, registry=r)
        self.kv_usage_l = self.kv_usage.labels(*lv)
        self.prompt_tokens = Counter(names.VLLM_PROMPT_TOKENS, "Prefill tokens processed.", LABELS, registry=r)
        self.prompt_tokens_l = self.prompt_tokens.labels(*lv)
        by_source = Counter(
            names.VLLM_PROMPT_TOKENS_BY_SOURCE.removesuffix("_total"),
            "Number of prompt tokens by source.",
            (*LABELS, "source"),
            registry=r,
        )
        self.prompt_by_source = {source: by_source.labels(*lv, source) for source in names.PROMPT_SOURCES}
        self.generation_tokens = Counter(names.VLLM_GENERATION_TOKENS, "Generation tokens.", LABELS, registry=r)
        self.generation_tokens_l = self.generation_tokens.labels(*lv)
        self.prefix_queries = Counter(
            names.VLLM_PREFIX_CACHE_QUERIES, "Prefix-cache queries, in queried tokens.", LABELS, registry=r
        )
        self.prefix_queries_l = self.prefix_queries.labels(*lv)
        self.prefix_hits = Counter(
            names.VLLM_PREFIX_CACHE_HITS, "Prefix-cache hits, in hit tokens.", LABELS, registry=r
        )
        self.prefix_hits_l = self.prefix_hits.labels(*lv)
        self.ttft = Histogram(
            names.VLLM_TTFT_SECONDS, "Time to first token (s).", LABELS, buckets=TTFT_BUCKETS, registry=r
        )
        self.ttft_l = self.ttft.labels(*lv)
        self.inter_token = Histogram(
            names.VLLM_INTER_TOKEN_LATENCY_SECONDS,
            "Time between consecutive output tokens (s).",
            LABELS,
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.inter_token_l = self.inter_token.labels(*lv)
        self.request_tpot = Histogram(
            names.VLLM_REQUEST_TPOT_SECONDS,
            "Each finished request's mean time per output token (s).",
            LABELS,
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.request_tpot_l = self.request_tpot.labels(*lv)
        self.queue_time = Histogram(
            names.VLLM_QUEUE_TIME_SECONDS, "Time in WAITING (s).", LABELS, buckets=QUEUE_BUCKETS, registry=r
        )
        self.queue_time_l = self.queue_time.labels(*lv)
        self.e2e = Histogram(
            names.VLLM_E2E_LATENCY_SECONDS,
            "End-to-end request latency (s).",
            LABELS,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e_l = self.e2e.labels(*lv)
        self.success = Counter(
            names.VLLM_REQUEST_SUCCESS, "Finished requests.", (*LABELS, "finished_reason"), registry=r
        )
        self.success_lv = lv
        self.kv_sent = Counter(names.METRIC_ENGINE_KV_BYTES_SENT, "KV bytes served to decodes.", registry=r)
        self.kv_received = Counter(names.METRIC_ENGINE_KV_BYTES_RECEIVED, "KV bytes pulled.", registry=r)
        self.nixl_bytes = Histogram(
            names.VLLM_NIXL_BYTES_TRANSFERRED,
            "Bytes per KV transfer pulled (model bytes), as vLLM's NixlConnector reports them.",
            LABELS,
            buckets=NIXL_BYTES_BUCKETS,
            registry=r,
        )
        self.nixl_bytes_l = self.nixl_bytes.labels(*lv)
        self.kv_handles = Gauge(names.METRIC_ENGINE_KV_HANDLES, "KV held for remote decodes.", registry=r)
        self.kv_expired = Counter(names.METRIC_ENGINE_KV_EXPIRED, "Held KV freed by the timeout.", registry=r)
        self.info = Gauge(
            names.METRIC_ENGINE_INFO, "Engine role and hardware.", ("role", "hardware", "engine_id"), registry=r
        )
        self.draining = Gauge(names.METRIC_ENGINE_DRAINING, "1 while draining.", registry=r)

    def set_info(self, role: str, hardware: str, engine_id: str) -> None:
        self.info.clear()
        self.info.labels(role, hardware, engine_id).set(1)

    def finished(self, reason: str) -> None:
        self.success.labels(*self.success_lv, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
