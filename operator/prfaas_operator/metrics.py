"""The operator's own metrics (``prfaas_operator_*``), on a registry it owns (no global state).

Decisions are counted by action, a *reason kind* (a short, bounded label derived from the decision's reason;
the full reason goes to status, events and logs, never into a label) and the PD cluster (``namespace``,
``pd_cluster``, as on ``prfaas_operator_role_instances``).

The same HTTP server answers the kubelet's probes: ``/healthz`` and ``/readyz`` (:mod:`.health`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from prfaas_core.names import (
    METRIC_OPERATOR_API_RETRIES,
    METRIC_OPERATOR_CYCLE_SECONDS,
    METRIC_OPERATOR_DECISIONS,
    METRIC_OPERATOR_DESIRED_INSTANCES,
    METRIC_OPERATOR_LEADER,
    METRIC_OPERATOR_PROMETHEUS_ERRORS,
    METRIC_OPERATOR_PROMETHEUS_QUERIES,
    METRIC_OPERATOR_READY_INSTANCES,
    METRIC_OPERATOR_RECONCILE_SECONDS,
    METRIC_OPERATOR_RESYNC_REPAIRS,
    METRIC_OPERATOR_RESYNCS,
    METRIC_OPERATOR_ROLE_INSTANCES,
    METRIC_OPERATOR_SCALING_BLOCKED,
)

from .health import Health

_KINDS = (
    ("dry-run", "dry-run"),
    ("manual override", "override"),
    ("policy.suspend", "suspended"),
    ("pending flip abandoned", "abandoned"),
    ("drain timeout", "drain-timeout"),
    ("more hardware", "both-queue"),
    ("cooldown", "cooldown"),
    ("at its minimum", "bounds"),
    ("at its maximum", "bounds"),
    ("no prefill instance free", "no-candidate"),
    ("no decode instance free", "no-candidate"),
    (" cycles)", "hysteresis"),
    ("initial role assignment", "initial"),
    ("drained", "drained"),
    ("draining", "drain"),
    ("decode-bound by the model", "decode-bound-model"),
    ("prefill-bound by the model", "prefill-bound-model"),
    (" leans ", "balanced"),  # the model leans one way, but a flip would not help: held as balanced
    ("decode-bound", "decode-bound"),
    ("prefill-bound", "prefill-bound"),
    ("balanced", "balanced"),
)


def reason_kind(reason: str) -> str:
    """A bounded label for a decision's reason (first matching phrase wins)."""
    for phrase, kind in _KINDS:
        if phrase in reason:
            return kind
    return "other"


@dataclass
class OperatorMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.decisions = Counter(
            METRIC_OPERATOR_DECISIONS,
            "Long-term decisions by action, reason kind and PD cluster",
            ["action", "reason_kind", "namespace", "pd_cluster"],
            registry=r,
        )
        self.reconcile_seconds = Histogram(
            METRIC_OPERATOR_RECONCILE_SECONDS,
            "Duration of one object's reconcile",
            ["kind"],
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.prometheus_errors = Counter(
            METRIC_OPERATOR_PROMETHEUS_ERRORS, "Failed or empty Prometheus reads", ["reason"], registry=r
        )
        self.prometheus_queries = Counter(METRIC_OPERATOR_PROMETHEUS_QUERIES, "Prometheus queries sent", registry=r)
        self.role_instances = Gauge(
            METRIC_OPERATOR_ROLE_INSTANCES, "PD instances per role", ["namespace", "pd_cluster", "role"], registry=r
        )
        sized = ["namespace", "pd_cluster", "prefill_cluster", "role"]
        self.desired_instances = Gauge(
            METRIC_OPERATOR_DESIRED_INSTANCES, "Instances a cluster should run (elastic capacity)", sized, registry=r
        )
        self.ready_instances = Gauge(
            METRIC_OPERATOR_READY_INSTANCES, "Instances serving (elastic capacity)", sized, registry=r
        )
        self.scaling_blocked = Gauge(
            METRIC_OPERATOR_SCALING_BLOCKED,
            "1 while a scale-out is held back by max or budget",
            [*sized, "reason"],
            registry=r,
        )
        self.api_retries = Counter(
            METRIC_OPERATOR_API_RETRIES,
            "Kubernetes API calls retried, by HTTP status (0: connection)",
            ["status"],
            registry=r,
        )
        self.leader = Gauge(METRIC_OPERATOR_LEADER, "1 while this replica holds the Lease", registry=r)
        self.cycle_seconds = Histogram(
            METRIC_OPERATOR_CYCLE_SECONDS,
            "Duration of one batched cycle over all objects",
            registry=r,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.resyncs = Counter(
            METRIC_OPERATOR_RESYNCS, "Periodic re-lists of the served objects", ["result"], registry=r
        )
        self.resync_repairs = Counter(
            METRIC_OPERATOR_RESYNC_REPAIRS,
            "Cache entries a re-list repaired (add, update, remove), by kind",
            ["kind", "action"],
            registry=r,
        )
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @contextmanager
    def reconcile_timer(self, kind: str) -> Iterator[None]:
        """Observe how long the block (one object's reconcile) took on ``prfaas_operator_reconcile_seconds{kind}``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.reconcile_seconds.labels(kind=kind).observe(time.perf_counter() - started)

    def serve(self, port: int, host: str = "0.0.0.0", health: Health | None = None) -> None:
        """``/metrics`` (any other path too, as prometheus_client answers), ``/healthz`` and ``/readyz``, from a
        daemon thread (so a blocked event loop cannot keep the probes from being answered)."""
        metrics_app = make_wsgi_app(self.registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if health is not None and path in ("/healthz", "/readyz"):
                ok, why = health.ready() if path == "/readyz" else health.live()
                body = f"{'ok' if ok else 'failed'}: {why}\n".encode()
                start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
                return [body]
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]

        server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_Quiet)
        self._thread = threading.Thread(target=server.serve_forever, name="prfaas-metrics", daemon=True)
        self._thread.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _Quiet(WSGIRequestHandler):
    """No access log line per scrape or probe."""

    def log_message(self, format: str, *args: Any) -> None:
        return
