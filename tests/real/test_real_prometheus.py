"""The operator's default Prometheus queries on real series: a real Prometheus scrapes the tier's real vLLM
engines with the chart's own PodMonitor relabelling (its ``relabelings``, rendered by helm, applied to the pod
labels the example's engine workloads carry; the namespace and pod labels as the Prometheus Operator adds them),
and the operator's collector reads the PD cluster's roles and the PrFaaS queue from it. The loop's observation
matches the engines' own counters. (PodMonitor -> scrape config translation by a live Prometheus Operator is not
checked here; its relabel rules are.)"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from conftest import Engines, Prompts
from prfaas_cli.engines_cmd import load_clusters
from prfaas_core import names
from prfaas_core.api import PDCluster
from prfaas_core.api.pd_cluster import PrometheusQueries
from prfaas_local.ports import free_port
from prfaas_local.vllm_engines import EXAMPLE, REPO, RealEngine, RealEnv
from prfaas_operator.observe import ClusterQuery, PrometheusCollector, _templated
from prfaas_router.prom_text import sample_sum
from prfaas_testbed.prom import wait_until
from support.real_engines import skip_or_fail

NAMESPACE = "prfaas"


def _relabelings() -> list[dict[str, Any]]:
    """The chart's PodMonitor relabelings for the engines' port, as Prometheus relabel_configs."""
    helm = subprocess.run(["bash", str(REPO / "scripts/helm-tools.sh")], capture_output=True, text=True, check=True)
    out = subprocess.run(
        [helm.stdout.strip().splitlines()[-1], "template", "p", str(REPO / "helm/prfaas"),
         "--set", "monitoring.podMonitor.enabled=true", "-s", "templates/podmonitor.yaml"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    monitor = next(d for d in yaml.safe_load_all(out) if d and d["metadata"]["name"].endswith("pd-cluster"))
    endpoint = next(e for e in monitor["spec"]["podMetricsEndpoints"] if e["port"] == "http")
    rules = [{"source_labels": r["sourceLabels"], "target_label": r["targetLabel"]} for r in endpoint["relabelings"]]
    # what the Prometheus Operator adds to every PodMonitor target
    return [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        *rules,
    ]


def _target(engine: RealEngine, labels: dict[str, str]) -> dict[str, Any]:
    meta = {
        f"__meta_kubernetes_pod_label_{k.replace('.', '_').replace('/', '_').replace('-', '_')}": v
        for k, v in labels.items()
    }
    meta |= {"__meta_kubernetes_namespace": NAMESPACE, "__meta_kubernetes_pod_name": engine.name}
    return {"targets": [f"{engine.host}:{engine.spec.port}"], "labels": meta}


@pytest.fixture
def prometheus(engines: Engines, tmp_path: Path) -> Iterator[str]:
    if shutil.which("prometheus") is None:
        skip_or_fail("prometheus is not installed (scripts/system-deps.sh installs it)")
    # the pod labels the example's engine workloads carry (helm/prfaas/templates/engines.yaml)
    targets = [
        _target(engines.prfaas, {"prfaas.io/prefill-cluster": "prfaas-cpu"}),
        _target(engines.pdp0, {"prfaas.io/pd-cluster": "pd-cpu", "prfaas.io/role": "prefill"}),
        _target(engines.pdp1, {"prfaas.io/pd-cluster": "pd-cpu", "prfaas.io/role": "prefill"}),
        _target(engines.pdd, {"prfaas.io/pd-cluster": "pd-cpu", "prfaas.io/role": "decode"}),
    ]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "engines", "static_configs": targets, "relabel_configs": _relabelings()}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--query.lookback-delta=5s", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _query(url, "count(up == 1)") == [4.0], 60, "four engines scraped")
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


def _query(url: str, promql: str) -> list[float]:
    try:
        body = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=5).json()
    except (httpx.HTTPError, ValueError):  # not up yet ("Service Unavailable" while it starts)
        return []
    return [float(r["value"][1]) for r in body.get("data", {}).get("result", [])]


def test_operator_default_queries_observe_the_real_engines(
    prometheus: str, engines: Engines, real_env: RealEnv, prompts: Prompts
) -> None:
    clusters, _ = load_clusters([str(EXAMPLE)])
    pd = next(c for c in clusters if isinstance(c, PDCluster))
    q = PrometheusQueries()
    assert pd.spec.prometheus.queries == q  # the example uses the defaults

    def own(role: str, metric: str) -> float:
        members = engines.pd_prefill if role == "prefill" else [engines.pdd]
        return sum(sample_sum(e.metrics_text(), metric, {}) or 0.0 for e in members)

    def observed(template: str, role: str) -> list[float]:
        return _query(prometheus, _templated(template, NAMESPACE, "pd-cpu", role, pd.spec.prometheus.window_seconds))

    # a request prefilled on one PD prefill engine: the per-role prompt-token counters move, and the loop's
    # default rate query sees prompt tokens flowing on the prefill role only
    body = {"model": real_env.served_model_name, "prompt": prompts.text(400), "max_tokens": 1}
    r = httpx.post(f"{engines.pdp0.url}/v1/completions", json=body, timeout=120)
    r.raise_for_status()
    selector = 'namespace="prfaas", pd_cluster="pd-cpu", role="{role}"'
    for role in ("prefill", "decode"):
        counter = f"sum({names.VLLM_PROMPT_TOKENS}{{{selector.format(role=role)}}})"

        def caught_up(counter: str = counter, role: str = role) -> bool:
            return _query(prometheus, counter) == [own(role, names.VLLM_PROMPT_TOKENS)]

        wait_until(caught_up, 30, f"{role} prompt tokens scraped")
    assert observed(q.prompt_tokens_rate, "prefill")[0] > 0
    # the collector's cycle read: both roles of pd-cpu, values equal to the engines' own gauges (idle now)
    snap = PrometheusCollector()._collect(
        time.time(), [ClusterQuery((NAMESPACE, "pd-cpu"), prometheus, pd.spec)], [], {prometheus}
    )
    metrics, why = snap.for_cluster((NAMESPACE, "pd-cpu"), prometheus)
    assert metrics is not None, why
    for role in ("prefill", "decode"):
        assert metrics.queue_depth[role] == own(role, names.VLLM_REQUESTS_WAITING)
        assert metrics.running[role] == own(role, names.VLLM_REQUESTS_RUNNING)
        usage = [sample_sum(e.metrics_text(), names.VLLM_KV_CACHE_USAGE, {}) or 0.0
                 for e in (engines.pd_prefill if role == "prefill" else [engines.pdd])]  # fmt: skip
        assert metrics.kv_cache_usage[role] == pytest.approx(sum(usage) / len(usage))
    assert set(metrics.in_flight) == {"pdp0", "pdp1", "pdd"}  # per pod, from the relabelled pod label
    # the PrFaaS cluster's queue, by prefill_cluster (the PodMonitor's other label)
    assert snap.prefill_queue[(NAMESPACE, "prfaas-cpu")] == sample_sum(
        engines.prfaas.metrics_text(), names.VLLM_REQUESTS_WAITING, {}
    )
