"""A real Prometheus (Debian's binary) on 127.0.0.1, scraping a live exporter the test controls.

The exporter serves vLLM's metric names per engine pod with the labels a ServiceMonitor would add
(``namespace``, ``pd_cluster``, ``role``, ``pod``); the role of each pod is read from the Kubernetes API
emulator at scrape time, like Prometheus' pod relabelling. Tests set queue depths per role and work in
flight per pod, and the link's egress counter. Pods labelled ``prfaas.io/prefill-cluster`` (a PrFaaS site's
engines) carry ``prefill_cluster`` instead of ``pd_cluster``; tests set a site's queue and, for elastic capacity,
token and request rates per cluster and role (``set_rates``), integrated into vLLM's counters at scrape time.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from prfaas_core.names import (
    LABEL_PD_CLUSTER,
    LABEL_PREFILL_CLUSTER,
    LABEL_ROLE,
    METRIC_ROUTER_REMOTE_BYTES,
    VLLM_GENERATION_TOKENS,
    VLLM_KV_CACHE_USAGE,
    VLLM_PROMPT_TOKENS,
    VLLM_REQUEST_SUCCESS,
    VLLM_REQUESTS_RUNNING,
    VLLM_REQUESTS_WAITING,
)
from prfaas_local.ports import free_port

RateKey = tuple[str, str, str, str]
"""(namespace, pd_cluster, prefill_cluster, role): one of them empty."""
RATE_FAMILIES = {"prompt": VLLM_PROMPT_TOKENS, "requests": VLLM_REQUEST_SUCCESS, "generation": VLLM_GENERATION_TOKENS}


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.2) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except (httpx.HTTPError, KeyError, IndexError, TypeError) as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what} (last: {last!r})")


class EngineExporter(Collector):
    """vLLM-style per-pod series, roles looked up in the emulator at scrape time."""

    def __init__(self, k8s_url: str) -> None:
        self.k8s_url = k8s_url
        self.lock = threading.Lock()
        self.waiting: dict[tuple[str, str, str], float] = {}  # (namespace, pd_cluster, role) -> queue
        self.running: dict[tuple[str, str], float] = {}  # (namespace, pod) -> in flight
        self.egress_bytes: dict[str, float] = {}  # link -> counter
        self.egress_rate_bps: dict[str, float] = {}  # link -> bytes/s, integrated at scrape time
        self._last_scrape = time.monotonic()
        self.http = httpx.Client(timeout=5)
        self.enabled_namespaces: set[str] = set()
        self.site_waiting: dict[tuple[str, str], float] = {}  # (namespace, prefill_cluster) -> queue
        self.rates: dict[RateKey, dict[str, float]] = {}  # -> family -> per second
        self.counters: dict[RateKey, dict[str, float]] = {}
        self._last_rates = time.monotonic()

    def set_rates(
        self,
        namespace: str,
        *,
        pd_cluster: str = "",
        prefill_cluster: str = "",
        role: str = "",
        prompt: float = 0.0,
        requests: float = 0.0,
        generation: float = 0.0,
    ) -> None:
        """Token and request rates (per second) the cluster's engines report from now on."""
        with self.lock:
            self._integrate(time.monotonic())
            key = (namespace, pd_cluster, prefill_cluster, role)
            self.rates[key] = {"prompt": prompt, "requests": requests, "generation": generation}

    def set_site_queue(self, namespace: str, prefill_cluster: str, value: float) -> None:
        with self.lock:
            self.site_waiting[(namespace, prefill_cluster)] = value

    def _integrate(self, now: float) -> None:
        dt, self._last_rates = now - self._last_rates, now
        for key, rates in self.rates.items():
            counters = self.counters.setdefault(key, {f: 0.0 for f in RATE_FAMILIES})
            for family, rate in rates.items():
                counters[family] += rate * dt

    def set_queue(self, namespace: str, pd_cluster: str, role: str, value: float) -> None:
        with self.lock:
            self.waiting[(namespace, pd_cluster, role)] = value

    def collect(self) -> Iterator[Any]:
        by = ["namespace", "pd_cluster", "prefill_cluster", "role", "pod"]
        waiting = GaugeMetricFamily(VLLM_REQUESTS_WAITING, "waiting", labels=by)
        running = GaugeMetricFamily(VLLM_REQUESTS_RUNNING, "running", labels=by)
        kv = GaugeMetricFamily(VLLM_KV_CACHE_USAGE, "kv", labels=by)
        counted = [
            CounterMetricFamily(metric.removesuffix("_total"), family, labels=by[:4])
            for family, metric in RATE_FAMILIES.items()
        ]
        with self.lock:
            namespaces = sorted(self.enabled_namespaces)
            queues = dict(self.waiting)
            flights = dict(self.running)
            site_queues = dict(self.site_waiting)
            self._integrate(time.monotonic())
            for key, counters in self.counters.items():
                if key[0] in namespaces:
                    for family, fam in zip(RATE_FAMILIES, counted, strict=True):
                        fam.add_metric(list(key), counters[family])
        for ns in namespaces:
            if self.http.is_closed:
                break
            try:
                pods = self.http.get(f"{self.k8s_url}/api/v1/namespaces/{ns}/pods").json().get("items") or []
            except (httpx.HTTPError, ValueError):
                continue
            placed: set[tuple[str, str]] = set()
            for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
                labels = pod["metadata"].get("labels") or {}
                pd, role, name = labels.get(LABEL_PD_CLUSTER), labels.get(LABEL_ROLE, "both"), pod["metadata"]["name"]
                site = labels.get(LABEL_PREFILL_CLUSTER)
                if site and not pd:  # a PrFaaS site's engine
                    q = 0.0
                    if ("", site) not in placed:
                        q = site_queues.get((ns, site), 0.0)
                        placed.add(("", site))
                    waiting.add_metric([ns, "", site, "prefill", name], q)
                    running.add_metric([ns, "", site, "prefill", name], flights.get((ns, name), 0.0))
                    continue
                if not pd:
                    continue
                q = 0.0
                if (pd, role) not in placed:  # a role's queue sits on its first pod
                    q = queues.get((ns, pd, role), 0.0)
                    placed.add((pd, role))
                waiting.add_metric([ns, pd, "", role, name], q)
                running.add_metric([ns, pd, "", role, name], flights.get((ns, name), 0.0))
                kv.add_metric([ns, pd, "", role, name], 0.5)
        now = time.monotonic()
        egress = CounterMetricFamily(METRIC_ROUTER_REMOTE_BYTES.removesuffix("_total"), "admitted", labels=["link"])
        with self.lock:
            for link, rate in self.egress_rate_bps.items():
                self.egress_bytes[link] = self.egress_bytes.get(link, 0.0) + rate * (now - self._last_scrape)
            self._last_scrape = now
            for link, value in self.egress_bytes.items():
                egress.add_metric([link], value)
        yield from (waiting, running, kv, egress, *counted)


class PrometheusStack:
    """The exporter (in this process) and Prometheus (a child process) scraping it every ``scrape_s`` seconds
    (1 s for tests; the scale benchmark scrapes less often at thousands of pods, as a real Prometheus does)."""

    def __init__(self, k8s_url: str, scrape_s: float = 1.0) -> None:
        self.scrape_s = scrape_s
        self.exporter = EngineExporter(k8s_url)
        self.registry = CollectorRegistry()
        self.registry.register(self.exporter)
        self.dir = Path(tempfile.mkdtemp(prefix="prfaas-prom-"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._server: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> PrometheusStack:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is not installed (scripts/system-deps.sh installs it)")
        registry = self.registry

        class Metrics(BaseHTTPRequestHandler):
            """Always the classic text format: prometheus_client's own server would escape vLLM's colons
            for a scraper that negotiates OpenMetrics without UTF-8 names."""

            def do_GET(self) -> None:
                body = generate_latest(registry)
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # Prometheus stopped mid-scrape
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        exporter_port = self._server.server_port
        (self.dir / "prometheus.yml").write_text(
            f"global: {{scrape_interval: {self.scrape_s:g}s, evaluation_interval: {self.scrape_s:g}s}}\n"
            "scrape_configs:\n- job_name: engines\n  honor_labels: true\n"
            f"  static_configs: [{{targets: ['127.0.0.1:{exporter_port}']}}]\n"
        )
        self.proc = self._spawn()
        wait_until(lambda: httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200, 30, "Prometheus ready")
        wait_until(lambda: self.query("up") and self.query("up")[0]["value"][1] == "1", 30, "first scrape")
        return self

    def _spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                "prometheus",
                f"--config.file={self.dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                f"--query.lookback-delta={max(5.0, 3 * self.scrape_s):g}s",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def query(self, promql: str) -> list[dict[str, Any]]:
        resp = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=2)
        return list(resp.json()["data"]["result"])

    def stop_prometheus(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
            self.proc = None

    def restart_prometheus(self) -> None:
        self.stop_prometheus()
        self.proc = self._spawn()
        wait_until(lambda: httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200, 30, "Prometheus ready")

    def stop(self) -> None:
        self.stop_prometheus()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self.exporter.http.close()
        shutil.rmtree(self.dir, ignore_errors=True)
