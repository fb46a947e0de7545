"""Our queries on real series. A real Prometheus scrapes the tier's real vLLM engines with the chart's own
PodMonitor relabelling (its ``relabelings``, rendered by helm, applied to the pod labels the example's engine
workloads carry; the namespace and pod labels as the Prometheus Operator adds them):

- the operator's collector reads the PD cluster's roles and the PrFaaS queue from it, matching the engines' own
  counters;
- every vLLM metric name prfaas_core/names.py tags ``vllm`` is in the real engines' own ``/metrics`` (vLLM 0.32);
- with the tier's router and gateway scraped too (labelled as the chart's monitors label them), every metric
  selector of every dashboard panel and every alert expression returns a series, after the traffic that makes
  them (short, long, streamed requests); the exceptions are listed with why (EXCEPTIONS).

(PodMonitor -> scrape config translation by a live Prometheus Operator is not checked here; its relabel rules
are.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import promql_parser
import pytest
import yaml

from conftest import THRESHOLD_TOKENS, Engines, Prompts
from prfaas_cli.engines_cmd import load_clusters
from prfaas_core import names
from prfaas_core.api import PDCluster
from prfaas_core.api.pd_cluster import PrometheusQueries
from prfaas_local.dashboard_png import DASHBOARD, substitute
from prfaas_local.ports import free_port
from prfaas_local.stack import LocalStack
from prfaas_local.vllm_engines import EXAMPLE, REPO, RealEngine, RealEnv
from prfaas_operator.observe import ClusterQuery, PrometheusCollector, _templated
from prfaas_router.state.metrics import sample_sum
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


def _engine_targets(engines: Engines) -> list[dict[str, Any]]:
    """The pod labels the example's engine workloads carry (helm/prfaas/templates/engines.yaml)."""
    return [
        _target(engines.prfaas, {"prfaas.io/prefill-cluster": "prfaas-cpu"}),
        _target(engines.pdp0, {"prfaas.io/pd-cluster": "pd-cpu", "prfaas.io/role": "prefill"}),
        _target(engines.pdp1, {"prfaas.io/pd-cluster": "pd-cpu", "prfaas.io/role": "prefill"}),
        _target(engines.pdd, {"prfaas.io/pd-cluster": "pd-cpu", "prfaas.io/role": "decode"}),
    ]


def _start_prometheus(tmp_path: Path, scrape_configs: list[dict[str, Any]], targets: int) -> Iterator[str]:
    if shutil.which("prometheus") is None:
        skip_or_fail("prometheus is not installed (scripts/system-deps.sh installs it)")
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": scrape_configs}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--query.lookback-delta=5s", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _query(url, "count(up == 1)") == [float(targets)], 60, f"{targets} targets scraped")
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.fixture
def prometheus(engines: Engines, tmp_path: Path) -> Iterator[str]:
    job = {"job_name": "engines", "static_configs": _engine_targets(engines), "relabel_configs": _relabelings()}
    yield from _start_prometheus(tmp_path, [job], 4)


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


def test_every_vllm_name_we_read_is_exported_by_real_vllm(engines: Engines) -> None:
    """names.py's ``vllm`` tags are true: each name is in a real vLLM 0.32 engine's own /metrics (its decode after a
    KV pull has them all: the tier's warm-up pulled from every producer)."""
    exported: set[str] = set()
    for engine in (engines.prfaas, engines.pdp0, engines.pdp1, engines.pdd):
        exported |= set(re.findall(r"^# TYPE (\S+) ", engine.metrics_text(), flags=re.MULTILINE))
    ours = sorted(n for n, who in names.EXPORTERS.items() if who == "vllm")
    missing = [n for n in ours if n not in exported and n.removesuffix("_total") not in exported]
    assert not missing, f"tagged vllm in prfaas_core/names.py but not exported by vLLM: {missing}"


CALENDAR = (
    "the tier's gateway runs without the link calendar (gateway.admission, from the PrefillCluster's "
    "linkScheduling, is optional and unset here): its series exist only with it; tests/integration/test_dashboard.py "
    "scrapes a gateway with the calendar and checks these panels, promtool cases in alerts/tests cover the alerts"
)
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("prfaas_operator_", ""): "the real tier runs no operator: tests/integration/test_dashboard.py runs the operator "
    "(a real process against the Kubernetes API emulator) and checks its panels and alert series there",
    ("prfaas_gateway_admission", ""): CALENDAR,
    ("prfaas_gateway_link_", ""): CALENDAR,
    ("prfaas_gateway_pull_", ""): CALENDAR,
    ("prfaas_gateway_claims_", ""): CALENDAR + " (the claims it corrects are the calendar's bookings)",
    ("prfaas_gateway_loans_total", ""): CALENDAR + " (and loans need a second gateway replica)",
    ("prfaas_gateway_site_", ""): CALENDAR + " (and a site egress cap, gateway.siteEgressCapGbps: the observability "
    "stack of tests/integration/test_dashboard.py sets one that never binds)",
    ("prfaas_router_replica_sync_total", 'result=~"unreachable|refused|unauthorized"'): "needs router replicas that "
    "cannot reach each other (one router here); promtool cases in alerts/tests",
    ("prfaas_router_ttft_slo_total", 'result="missed"'): "needs a request that misses its TTFT objective (the tiny "
    "model meets the tier's SLO); the dashboard reads it `or 0 *` the total, the burn alerts are promtool-tested",
}
"""Selectors that need an event this tier does not cause, each with why and where else it is checked."""


def _selectors(expr: str) -> list[str]:
    out: list[str] = []

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            out.append(str(node).removesuffix("{}"))
        return True

    promql_parser.walk(promql_parser.parse(substitute(expr)), visit)
    return out


def _every_selector() -> dict[str, str]:
    """selector -> where it is read (a panel or an alert)."""
    found: dict[str, str] = {}
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            for sel in _selectors(target["expr"]):
                found.setdefault(sel, f"panel {panel['title']!r}")
    rules = yaml.safe_load((REPO / "alerts" / "prfaas-rules.yaml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            for sel in _selectors(rule["expr"]):
                found.setdefault(sel, f"alert {rule['alert']}")
    return found


def _excepted(selector: str) -> bool:
    return any(selector.startswith(prefix) and fragment in selector for prefix, fragment in EXCEPTIONS)


@pytest.fixture
def observed(engines: Engines, stack: LocalStack, tmp_path: Path) -> Iterator[str]:
    """A Prometheus scraping the engines (PodMonitor relabelling), the router (labelled with the PD cluster it
    fronts, as the chart's ServiceMonitor does) and the gateway (its bearer token, as the ServiceMonitor sends it)."""
    target = {"__meta_kubernetes_namespace": NAMESPACE}
    jobs = [
        {"job_name": "engines", "static_configs": _engine_targets(engines), "relabel_configs": _relabelings()},
        {
            "job_name": "prfaas-router",
            "static_configs": [
                {"targets": [stack.url("router").removeprefix("http://")], "labels": {**target, "pd_cluster": "pd-cpu"}}
            ],
            "relabel_configs": [{"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}],
        },
        {
            "job_name": "prfaas-gateway",
            "authorization": {"credentials_file": str(stack.token_file)},
            "static_configs": [{"targets": [stack.url("gateway").removeprefix("http://")], "labels": target}],
            "relabel_configs": [{"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}],
        },
    ]
    yield from _start_prometheus(tmp_path, jobs, 6)


def test_every_panel_and_alert_selector_returns_a_series_from_real_engines_router_and_gateway(
    observed: str, stack: LocalStack, real_env: RealEnv, prompts: Prompts
) -> None:
    selectors = _every_selector()
    stale = [k for k in EXCEPTIONS if not any(s.startswith(k[0]) and k[1] in s for s in selectors)]
    assert not stale, f"exceptions no panel or alert needs any more: {stale}"
    url = stack.url("router") + "/v1/completions"
    model = real_env.served_model_name
    # a short prompt (local prefill), a long one (remote, through the gateway), a streamed answer (the router's
    # TPOT), each with several output tokens (the decode's inter-token latency)
    for tokens, stream in ((200, False), (THRESHOLD_TOKENS + 400, False), (200, True)):
        body = {"model": model, "prompt": prompts.text(tokens), "max_tokens": 8, "stream": stream}
        r = httpx.post(url, json=body, timeout=120)
        assert r.status_code == 200, r.text
    routes = set()

    def seen_remote() -> bool:
        routes.update(r["metric"].get("route") for r in _result(observed, "prfaas_router_route_decisions_total"))
        return "remote" in routes

    wait_until(seen_remote, 30, "the long prompt routed remote, scraped")
    empty: list[str] = []

    def every_selector_answers() -> bool:
        empty[:] = [f"{sel} ({where})" for sel, where in sorted(selectors.items())
                    if not _excepted(sel) and not _query(observed, sel)]  # fmt: skip
        return not empty

    try:
        wait_until(every_selector_answers, 30, "every selector to return a series", interval_s=1.0)
    except AssertionError as exc:
        raise AssertionError(f"selectors without a series on real engines: {empty}") from exc


def _result(url: str, promql: str) -> list[dict[str, Any]]:
    try:
        body = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return []
    return list(body.get("data", {}).get("result", []))
