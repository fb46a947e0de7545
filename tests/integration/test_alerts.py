"""The alert rules: built by scripts/build_alerts.py, valid for Prometheus (promtool check), unit-tested (promtool
test rules: every alert fires in one case and stays silent in another), every expression parsed by promql-parser,
every metric name one the core's names module declares, per PD cluster or per link, and the chart's rendering
(a Helm template of the same rules) equal to alerts/prfaas-rules.yaml with its default values and following its
values otherwise. That the names are really exported by live components is checked in test_dashboard.py and, on
real engines, in tests/real/test_real_prometheus.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from test_dashboard import metric_names

from prfaas_core import names


@pytest.fixture(scope="session")
def helm() -> str:
    proc = subprocess.run(["bash", str(REPO / "scripts" / "helm-tools.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "alerts" / "prfaas-rules.yaml"
TESTS = REPO / "alerts" / "tests" / "prfaas-rules.test.yaml"
ISSUE_ALERTS = {
    "link egress near cap": "PrfaasLinkEgressNearCap",
    "breaker open": "PrfaasRemoteBreakerOpen",
    "operator not reconciling": "PrfaasOperatorNotReconciling",
    "Prometheus data missing": "PrfaasOperatorPrometheusErrors",
    "TTFT SLO burn": "PrfaasTTFTSLOBurnFast",
    "engine metrics missing (per PD cluster)": "PrfaasEngineMetricsMissing",
    "PrFaaS engine metrics missing (per gateway namespace)": "PrfaasPrefillEngineMetricsMissing",
    "router metrics missing (per PD cluster)": "PrfaasRouterMetricsMissing",
    "role flapping": "PrfaasRoleFlapping",
}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: scripts/system-deps.sh installs Debian's prometheus package")
    return path


def rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def declared_metric_names() -> set[str]:
    out = set()
    for key, value in vars(names).items():
        if key.startswith(("METRIC_", "VLLM_")) and isinstance(value, str):
            out.add(value)
    return out


def test_promtool_checks_the_rules() -> None:
    proc = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules())} rules found" in proc.stdout


def test_promtool_unit_tests_pass() -> None:
    proc = subprocess.run([promtool(), "test", "rules", str(TESTS)], capture_output=True, text=True, cwd=TESTS.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


def test_every_alert_is_unit_tested_and_the_issues_alerts_exist() -> None:
    tested = {case["alertname"] for t in yaml.safe_load(TESTS.read_text())["tests"] for case in t["alert_rule_test"]}
    alerts = {r["alert"] for r in rules()}
    assert alerts == tested
    assert set(ISSUE_ALERTS.values()) <= alerts


def test_a_broken_rule_fails_the_unit_tests(tmp_path: Path) -> None:
    """The tests have teeth: shortening a `for` makes them fail."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "prfaas-rules.yaml").write_text(RULES.read_text().replace("for: 10m", "for: 1m"))
    (tmp_path / "tests" / TESTS.name).write_text(TESTS.read_text())
    proc = subprocess.run(
        [promtool(), "test", "rules", str(tmp_path / "tests" / TESTS.name)], capture_output=True, text=True
    )
    assert proc.returncode != 0 and "FAILED" in proc.stdout + proc.stderr


def test_rules_use_only_metric_names_of_the_names_module() -> None:
    declared = declared_metric_names()
    for rule in rules():
        promql_parser.parse(rule["expr"])
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        for name in metric_names(rule["expr"]):
            base = name.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum")
            assert name in declared or base in declared, f"{rule['alert']}: {name} is not in prfaas_core.names"


def test_both_renderings_are_what_the_builder_writes() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build_alerts.py"), "--check"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def _chart_rules(helm: str, *sets: str) -> dict[str, Any]:
    argv = [helm, "template", "p", str(REPO / "helm/prfaas"), "--set", "monitoring.prometheusRule.enabled=true"]
    for s in sets:
        argv += ["--set", s]
    out = subprocess.run([*argv, "-s", "templates/prometheusrule.yaml"], capture_output=True, text=True, check=True)
    rule = yaml.safe_load(out.stdout)
    assert rule["kind"] == "PrometheusRule"
    return dict(rule["spec"])


def test_the_chart_renders_alerts_prfaas_rules_yaml_with_its_defaults(helm: str) -> None:
    assert _chart_rules(helm) == yaml.safe_load(RULES.read_text())


def test_the_chart_values_set_thresholds_windows_durations_and_the_runbook(helm: str, tmp_path: Path) -> None:
    spec = _chart_rules(
        helm,
        "monitoring.prometheusRule.runbookBaseUrl=https://wiki.example.org/prfaas",
        "monitoring.prometheusRule.alerts.sloBurnFast.factor=10",
        "monitoring.prometheusRule.alerts.sloBurnFast.shortWindow=10m",
        "monitoring.prometheusRule.alerts.breakerOpen.for=7m",
        "monitoring.prometheusRule.alerts.roleFlapping.maxChanges=9",
    )
    by_name = {r["alert"]: r for g in spec["groups"] for r in g["rules"]}
    fast = by_name["PrfaasTTFTSLOBurnFast"]
    assert "(10 * (1 -" in fast["expr"] and "[10m]" in fast["expr"] and "[5m]" not in fast["expr"]
    assert "10x faster" in fast["annotations"]["summary"]
    assert by_name["PrfaasRemoteBreakerOpen"]["for"] == "7m"
    assert by_name["PrfaasRoleFlapping"]["expr"].endswith("> 9")
    for name, rule in by_name.items():
        assert rule["annotations"]["runbook_url"] == f"https://wiki.example.org/prfaas#{name.lower()}"
    # what the chart renders from other values is still a valid rule file
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
    proc = subprocess.run([promtool(), "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_fires_in_one_case_and_stays_silent_in_another() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for t in yaml.safe_load(TESTS.read_text())["tests"]:
        for case in t["alert_rule_test"]:
            (firing if case["exp_alerts"] else silent).add(case["alertname"])
    alerts = {r["alert"] for r in rules()}
    assert alerts - firing == set(), "alerts without a firing case"
    assert alerts - silent == set(), "alerts without a silent case"


def test_every_alert_is_per_cluster_or_per_link() -> None:
    """An aggregation keeps the PD cluster (namespace, pd_cluster), the link or the fleet site; the two global ones say
    why."""
    global_ok = {"PrfaasOperatorNotReconciling", "PrfaasOperatorMetricsMissing", "PrfaasOperatorPrometheusErrors"}
    for rule in rules():
        if rule["alert"] in global_ok:
            continue
        expr = " ".join(rule["expr"].split())
        keys = ("namespace, pd_cluster", "namespace, link", "namespace, site", "by (namespace)", "pd_cluster=")
        assert any(k in expr for k in keys) or rule["alert"] == "PrfaasRoleFlapping", rule["alert"]
        assert "sum(" not in expr.replace(" ", "") or "by" in expr, rule["alert"]


def test_absent_series_alerts_select_our_series() -> None:
    for rule in rules():
        expr = rule["expr"]
        for call in ("absent(", "absent_over_time("):
            if call in expr:
                inner = expr.split(call, 1)[1]
                assert inner.split("[", 1)[0].rstrip().endswith("}"), f"{rule['alert']}: absent() without a selector"


RUNBOOK = REPO / "docs" / "runbook.md"
RUNBOOK_URL = (
    yaml.safe_load((REPO / "helm/prfaas/values.yaml").read_text())["monitoring"]["prometheusRule"]["runbookBaseUrl"]
    + "#"
)


def test_every_alert_links_a_runbook_section_that_exists() -> None:
    import re

    anchors = {
        re.sub(r"[^a-z0-9 -]", "", m.group(1).strip().lower()).replace(" ", "-")
        for m in re.finditer(r"^## (.+)$", RUNBOOK.read_text(), flags=re.MULTILINE)
    }
    for rule in rules():
        if "alert" not in rule:
            continue
        url = rule["annotations"].get("runbook_url", "")
        assert url.startswith(RUNBOOK_URL), f"{rule['alert']}: runbook_url {url!r}"
        assert url.removeprefix(RUNBOOK_URL) in anchors, f"{rule['alert']}: no section {url} in docs/runbook.md"


def test_ttft_burn_alerts_read_each_requests_own_slo() -> None:
    """No fixed histogram threshold: the burn alerts read the routers' per-request SLO verdicts."""
    for rule in rules():
        if rule.get("alert", "").startswith("PrfaasTTFTSLOBurn"):
            used = metric_names(rule["expr"])
            assert names.METRIC_ROUTER_TTFT_SLO in used, rule["alert"]
            assert names.METRIC_ROUTER_TTFT_SLO_OBJECTIVE in used, rule["alert"]
            assert "le=" not in rule["expr"]
