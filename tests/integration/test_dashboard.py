"""The Grafana dashboard: built by its script, every expression valid PromQL, every metric name exported by a
live component, and every panel answering with at least one series from a real Prometheus that scrapes the
real router, gateway, engines, link emulator and operator (observability_stack.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
from observability_stack import ObservedStack, start, substitute
from prometheus_client.parser import text_string_to_metric_families
from testbed_support import processes

from prfaas_testbed.operator_harness import Harness
from prfaas_testbed.prom import wait_until

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "dashboards" / "prfaas.json"
PROMETHEUS_OWN = {"up"}
"""Series Prometheus makes itself (not exported by a component)."""

pytestmark = pytest.mark.timeout(300)


def panels() -> list[dict[str, Any]]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (vector selectors, including {__name__="..."})."""
    found: set[str] = set()

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                found.add(node.name)
            for m in node.matchers.matchers if node.matchers else []:
                if m.name == "__name__":
                    found.add(m.value)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def exported_names(text: str) -> set[str]:
    """Every sample and family name in a Prometheus text exposition."""
    out: set[str] = set()
    for family in text_string_to_metric_families(text):
        out.add(family.name)
        out.update(s.name for s in family.samples)
    return out


def test_dashboard_json_is_what_the_builder_writes() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build_dashboard.py"), "--check"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def test_dashboard_covers_what_the_sre_watches_and_every_expression_parses() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] and doc["schemaVersion"] >= 36
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert set(variables) == {"datasource", "namespace", "pd_cluster", "prefill_cluster", "link"}
    for name in ("namespace", "pd_cluster", "prefill_cluster", "link"):
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*", name
        promql_parser.parse(variables[name]["query"].removeprefix("label_values(").rsplit(",", 1)[0])
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    used: set[str] = set()
    for panel in panels():
        assert panel["description"] and panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{panel['title']}: no unit"
        for target in panel["targets"]:
            expr = substitute(target["expr"])
            assert "$" not in expr, f"{panel['title']}: unsubstituted variable in {expr}"
            promql_parser.parse(expr)  # raises on a syntax error
            used |= metric_names(expr)
    # the list: roles with reasons, t, egress vs cap, offload fraction, TTFT/TPOT by route, queues per
    # stage, breaker state, operator health
    for needed in (
        "prfaas_operator_role_instances",
        "prfaas_operator_decisions_total",
        "prfaas_router_route_decisions_total",
        "prfaas_router_threshold_tokens",
        "prfaas_router_remote_kv_bytes_total",
        "prfaas_gateway_kv_egress_bytes_total",
        "vllm:nixl_bytes_transferred_sum",
        "vllm:kv_cache_usage_perc",
        "prfaas_router_link_cap_gbps",
        "prfaas_router_ttft_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:request_time_per_output_token_seconds_bucket",
        "prfaas_router_tpot_seconds_bucket",
        "prfaas_router_ttft_slo_total",
        "prfaas_router_ttft_slo_objective_ratio",
        "prfaas_router_fallbacks_total",
        "prfaas_router_prefix_hit_tokens_total",
        "prfaas_router_uncached_prompt_tokens_bucket",
        "prfaas_router_threshold_min_tokens",
        "prfaas_router_link_available_gbps",
        "prfaas_router_link_available_source",
        "prfaas_gateway_link_available_gbps",
        "vllm:num_requests_waiting",
        "prfaas_router_breaker_open",
        "prfaas_operator_reconcile_duration_seconds_count",
    ):
        assert needed in used, needed


def test_the_breaker_and_link_states_are_state_panels_and_slo_panels_stats() -> None:
    by_title = {p["title"]: p for p in panels()}
    assert by_title["Remote breaker"]["type"] == "state-timeline"
    assert by_title["Link scarce"]["type"] == "state-timeline"
    assert by_title["TTFT SLO attainment (dashboard range)"]["type"] == "stat"
    assert by_title["Error budget left (dashboard range)"]["type"] == "stat"
    # no panel counts every scrape job of the Prometheus (the old "Scrape targets up")
    assert not any("up" in metric_names(substitute(t["expr"])) for p in panels() for t in p["targets"])


def test_the_egress_view_averages_the_cap_over_the_rate_window() -> None:
    """Egress is a rate over the panel's window; the cap it is drawn against is averaged over the same window."""
    egress = next(p for p in panels() if p["title"].startswith("Link egress vs cap"))
    exprs = [t["expr"] for t in egress["targets"]]
    assert any("avg_over_time(prfaas_router_link_cap_gbps" in e and "[$__rate_interval]" in e for e in exprs)
    assert all("[$__rate_interval]" in e for e in exprs)


def test_a_syntax_error_is_caught() -> None:
    with pytest.raises(ValueError):
        promql_parser.parse("sum by (link (rate(prfaas_link_egress_bytes_total[1m]))")


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObservedStack]:
    tmp = Path(tmp_path_factory.mktemp("dashboard"))
    harness = Harness(tmp)
    try:
        with processes(tmp) as procs:
            obs = start(procs, harness, tmp)
            try:
                statuses = obs.drive(12, long_share=0.5)
                assert statuses == {200: 12}, statuses
                yield obs
            finally:
                obs.stop()
    finally:
        harness.close()


def test_every_metric_name_of_the_dashboard_and_alerts_is_exported_by_a_live_component(
    observed: ObservedStack,
) -> None:
    import yaml

    live: set[str] = set()
    for job in observed.targets:
        live |= exported_names(observed.scrape(job))
    used: set[str] = set()
    for panel in panels():
        for target in panel["targets"]:
            used |= metric_names(substitute(target["expr"]))
    rules = yaml.safe_load((REPO / "alerts" / "prfaas-rules.yaml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            used |= metric_names(rule["expr"])
    missing = sorted(used - live - PROMETHEUS_OWN)
    assert not missing, f"not exported by any live component: {missing}"


def test_every_panel_returns_a_series_from_prometheus(observed: ObservedStack) -> None:
    def empty_panels() -> list[str]:
        out = []
        for panel in panels():
            if not any(observed.query(t["expr"]) for t in panel["targets"]):
                out.append(panel["title"])
        return out

    # rates need two scrapes after the traffic; the operator's decision counter needs two cycles
    last: list[str] = []

    def settled() -> bool:
        nonlocal last
        last = empty_panels()
        return not last

    try:
        wait_until(settled, 60, "every panel to return a series", interval_s=1.0)
    except AssertionError as exc:
        raise AssertionError(f"panels without a series: {last}") from exc
    # and the series mean what the panels say: both routes seen, the link carried KV, roles assigned
    routes = {r["metric"]["route"] for r in observed.query("sum by (route) (prfaas_router_route_decisions_total)")}
    assert routes == {"local", "remote"}
    egress = observed.query("sum(prfaas_router_remote_kv_bytes_total)")
    assert float(egress[0]["value"][1]) > 0
    served = observed.query("sum(prfaas_gateway_kv_egress_bytes_total)")
    assert float(served[0]["value"][1]) > 0
    roles = {
        r["metric"]["role"]: float(r["value"][1])
        for r in observed.query("sum by (role) (prfaas_operator_role_instances)")
    }
    assert roles == {"prefill": 3.0, "decode": 5.0}
