"""Real components scraped by a real Prometheus, for the dashboard's and alerts' checks and for the dashboard
picture (scripts/render_dashboard.py).

What runs, all on 127.0.0.1: the router stack (prfaas_local/stack.py, as tests/integration/testbed_support.py
starts it: a PrFaaS engine behind the prefill gateway, the link emulator, a PD prefill and a PD decode engine,
the router), and the operator as a real process against the Kubernetes API emulator
(tests/support/operator_harness.py, with its own
Prometheus feeding the long-term loop). A second Prometheus (Debian's binary) scrapes every one of them every
second, with the target labels the chart's PodMonitor adds to engine pods (``pd_cluster``,
``prefill_cluster``, ``role``). ``drive()`` sends a mix of short (local) and long (remote) requests.
"""

from __future__ import annotations

import concurrent.futures
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from testbed_support import GATEWAY_AUTH, Processes, Stack, http, prompt, start_stack

from prfaas_local import dashboard_png
from prfaas_testbed.operator_harness import Harness, OperatorProcess
from prfaas_testbed.prom import free_port, wait_until

RATE_INTERVAL = "1m"
"""What ``$__rate_interval`` becomes when a panel's expression is run outside Grafana."""


def substitute(expr: str) -> str:
    """A dashboard expression as Prometheus runs it (Grafana's macros replaced, every variable "All")."""
    return dashboard_png.substitute(expr, RATE_INTERVAL, "10m")


@dataclass
class ObservedStack:
    stack: Stack
    harness: Harness
    operator: OperatorProcess
    namespace: str
    dir: Path
    prom_port: int = 0
    prom: subprocess.Popen[bytes] | None = None
    targets: dict[str, str] = field(default_factory=dict)

    @property
    def prom_url(self) -> str:
        return f"http://127.0.0.1:{self.prom_port}"

    def scrape(self, job: str) -> str:
        """The component's /metrics, fetched like a plain client (classic text format; the gateway's with its
        bearer token)."""
        headers = GATEWAY_AUTH if job == "gateway" else None
        return httpx.get(f"http://{self.targets[job]}/metrics", headers=headers, timeout=5).text

    def query(self, expr: str) -> list[dict[str, Any]]:
        resp = httpx.get(f"{self.prom_url}/api/v1/query", params={"query": substitute(expr)}, timeout=10)
        body = resp.json()
        assert body.get("status") == "success", f"{expr}: {body}"
        return list(body["data"]["result"])

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
        params = {"query": substitute(expr), "start": str(start), "end": str(end), "step": str(step_s)}
        body = httpx.get(f"{self.prom_url}/api/v1/query_range", params=params, timeout=30).json()
        assert body.get("status") == "success", f"{expr}: {body}"
        return list(body["data"]["result"])

    def drive(self, requests: int, long_share: float = 0.4, concurrency: int = 4) -> dict[int, int]:
        """Send ``requests`` completions through the router; returns the count per HTTP status."""
        period = max(1, round(1 / long_share))
        sizes = [40_000 if i % period == 0 else 2_000 + 500 * (i % 7) for i in range(requests)]

        def one(i: int) -> int:
            # two in three stream (the router's TTFT histogram counts streamed first tokens)
            body = {"model": "m", "prompt": prompt(sizes[i]), "max_tokens": 8, "stream": i % 3 != 0}
            try:
                status, _ = http("POST", self.stack.router + "/v1/completions", body, timeout_s=60)
            except OSError:  # a dropped connection counts as status 0 (callers assert on the counts)
                return 0
            return status

        statuses: dict[int, int] = {}
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            for status in pool.map(one, range(requests)):
                statuses[status] = statuses.get(status, 0) + 1
        return statuses

    def stop(self) -> None:
        if self.prom is not None and self.prom.poll() is None:
            self.prom.terminate()
            try:
                self.prom.wait(10)
            except subprocess.TimeoutExpired:
                self.prom.kill()
                self.prom.wait(5)


def _prometheus_config(targets: dict[str, str], token_file: Path) -> dict[str, Any]:
    engine_labels = {
        "prf": {"prefill_cluster": "prfaas-h200", "role": "prefill"},
        "pdp": {"pd_cluster": "pd-h20", "role": "prefill"},
        "pdd": {"pd_cluster": "pd-h20", "role": "decode"},
    }
    scrape = []
    for job in ("router", "gateway", "link", "operator"):
        scrape.append({"job_name": job, "static_configs": [{"targets": [targets[job]]}]})
    # the gateway's /metrics needs its bearer token, as the chart's ServiceMonitor sends it
    scrape[1]["authorization"] = {"type": "Bearer", "credentials_file": str(token_file)}
    scrape.append(
        {
            "job_name": "engines",
            "static_configs": [
                {"targets": [targets[name]], "labels": labels} for name, labels in engine_labels.items()
            ],
        }
    )
    return {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": scrape}


PARTS = {"router": "router", "gateway": "gateway", "link": "link_admin", "prf": "prf", "pdp": "pdp", "pdd": "pdd"}
"""The scrape targets' names and the stack's parts they scrape."""


def start(procs: Processes, harness: Harness, tmp: Path) -> ObservedStack:
    """Start everything (the caller owns ``procs`` and ``harness`` and stops them); returns once Prometheus has
    scraped every target at least once."""
    namespace = harness.namespace()
    operator = harness.start_operator(namespace)
    harness.setup(namespace)
    # the gateway schedules its link (source-side admission), as a PrefillCluster's spec.linkScheduling asks, under
    # a site egress cap (spec.siteEgressCapGbps; above the link's cap, it never binds, and its series exist)
    stack = start_stack(procs, tmp, gateway_admission={"capacityGbps": 100.0, "siteEgressCapGbps": 100.0})
    targets = {name: stack.url(part).removeprefix("http://") for name, part in PARTS.items()}
    targets["operator"] = f"127.0.0.1:{operator.metrics_port}"
    obs = ObservedStack(stack, harness, operator, namespace, tmp, free_port(), None, targets)
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError("prometheus is not installed (scripts/system-deps.sh installs it)")
    config = tmp / "observe-prometheus.yml"
    config.write_text(yaml.safe_dump(_prometheus_config(targets, stack.token_file)))
    obs.prom = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp / 'observe-data'}",
            f"--web.listen-address=127.0.0.1:{obs.prom_port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_until(lambda: httpx.get(f"{obs.prom_url}/-/ready", timeout=1).status_code == 200, 30, "Prometheus ready")
    wait_until(
        lambda: sum(float(r["value"][1]) for r in obs.query("up")) >= len(targets), 30, "every target scraped up"
    )
    return obs
