"""A local Prometheus for ``prfaas up`` (Debian's binary, when installed): it scrapes every process of the
stack every second — the router, the gateway, each link relay, each engine with the labels the chart's
PodMonitor adds (``pd_cluster``/``prefill_cluster``, ``role``) — with the project's rules
(alerts/prfaas-rules.yaml) loaded, so the dashboard's queries and a user's own run against real series."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from .ports import free_port
from .procs import spawn_process, stop_processes
from .stack import LocalStack

RULES = Path(__file__).resolve().parents[2] / "alerts" / "prfaas-rules.yaml"
"""The project's rules, where this is a source checkout (an installed wheel has none: no rules then)."""
REGION_A, REGION_B = "region-a", "region-b"
"""The ``namespace`` label of each region's series (as the chart's monitors add it in a real cluster)."""


@dataclass
class LocalPrometheus:
    url: str
    proc: subprocess.Popen[bytes]
    config: Path

    def stop(self) -> None:
        stop_processes([self.proc])

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
        params = {"query": expr, "start": str(start), "end": str(end), "step": str(step_s)}
        body = httpx.get(f"{self.url}/api/v1/query_range", params=params, timeout=30).json()
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus refused {expr!r}: {body.get('error')}")
        return list(body["data"]["result"])


def scrape_config(stack: LocalStack, rules: Path | None) -> dict[str, Any]:
    def target(url: str) -> str:
        return url.removeprefix("http://").rstrip("/")

    # the labels the chart's monitors add in each region: region B's router and PD engines carry the PD cluster,
    # region A's gateway and PrFaaS engines the PrefillCluster, each in its own namespace
    region_a, region_b = {"namespace": REGION_A}, {"namespace": REGION_B, "pd_cluster": "pd-h20"}
    engines = []
    for ep in stack.router_config.endpoints if stack.router_config else []:
        engines.append({"targets": [target(ep.url)], "labels": {**region_b, "role": ep.role}})
    for name, url in stack.urls.items():
        if name.startswith("prfaas-"):
            labels = {**region_a, "prefill_cluster": "prfaas-h200", "role": "prefill"}
            engines.append({"targets": [target(url)], "labels": labels})
    links = [target(u.removesuffix("/metrics")) for u in stack.link_metric_urls]
    # the gateway's /metrics needs its token like every path but /health and /ready
    # absolute: Prometheus resolves a relative credentials_file against its config file's directory
    token = (stack.work_dir / "gateway-token").resolve()
    gateway_auth: dict[str, Any] = (
        {"authorization": {"type": "Bearer", "credentials_file": str(token)}} if token.exists() else {}
    )
    jobs = [
        {"job_name": "router", "static_configs": [{"targets": [target(stack.urls["router"])], "labels": region_b}]},
        {
            "job_name": "gateway",
            "static_configs": [{"targets": [target(stack.urls["gateway"])], "labels": region_a}],
            **gateway_auth,
        },
        {"job_name": "link", "static_configs": [{"targets": links}]},
        {"job_name": "engines", "static_configs": engines},
    ]
    out: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": jobs,
    }
    if rules is not None:
        out["rule_files"] = [str(rules)]
    return out


def start_prometheus(stack: LocalStack, work: Path, timeout_s: float = 60.0) -> LocalPrometheus | None:
    """Start it (None when the binary is not installed); returns once every target was scraped."""
    binary = shutil.which("prometheus")
    if binary is None:
        return None
    port = free_port()
    shutil.rmtree(work / "prometheus-data", ignore_errors=True)  # a fresh TSDB: this run's series only
    config = work / "prometheus.yml"
    rules = RULES if RULES.is_file() else None
    config.write_text(yaml.safe_dump(scrape_config(stack, rules)))
    argv = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={work / 'prometheus-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    proc = spawn_process(argv, work / "logs" / "prometheus.log")
    prom = LocalPrometheus(f"http://127.0.0.1:{port}", proc, config)
    jobs = scrape_config(stack, None)["scrape_configs"]
    n_targets = sum(len(sc["targets"]) for job in jobs for sc in job["static_configs"])
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {proc.returncode} (log: {work / 'logs' / 'prometheus.log'})")
        try:
            body = httpx.get(f"{prom.url}/api/v1/query", params={"query": "sum(up)"}, timeout=2).json()
            result = body["data"]["result"]
            if result and float(result[0]["value"][1]) >= n_targets:
                return prom
        except (httpx.HTTPError, KeyError, ValueError, IndexError):
            pass
        time.sleep(0.5)
    prom.stop()
    raise RuntimeError(f"prometheus did not scrape all {n_targets} targets within {timeout_s:.0f} s")


def alerts_seen(prom: LocalPrometheus, start: float, end: float) -> list[dict[str, Any]] | None:
    """Every alert of the project's rules that was pending or firing at any evaluation between ``start`` and
    ``end`` (its ``ALERTS`` series), with its labels; None when the rules are not loaded (no source checkout)."""
    if not RULES.is_file():
        return None
    span = max(1, round(end - start))
    query = f"max_over_time(ALERTS[{span}s])"
    body = httpx.get(f"{prom.url}/api/v1/query", params={"query": query, "time": str(end)}, timeout=30).json()
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {query!r}: {body.get('error')}")
    out = [{k: v for k, v in r["metric"].items() if k != "__name__"} for r in body["data"]["result"]]
    return sorted(out, key=lambda a: sorted(a.items()))


__all__ = ["REGION_A", "REGION_B", "LocalPrometheus", "alerts_seen", "scrape_config", "start_prometheus"]


@contextmanager
def running_stack(
    stack: LocalStack, prometheus: Callable[[], LocalPrometheus | None]
) -> Iterator[LocalPrometheus | None]:
    """Start ``stack``, then its local Prometheus (``prometheus()``: None for none); stop both on the way out."""
    prom: LocalPrometheus | None = None
    try:
        stack.start()
        prom = prometheus()
        yield prom
    finally:
        if prom is not None:
            prom.stop()
        stack.stop()
