"""The alert rules: valid for Prometheus (promtool check), unit-tested (promtool test rules), every expression
parsed by promql-parser, every metric name one the core's names module declares, and the chart's copy in
sync. That the names are really exported by live components is checked in test_dashboard.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from test_dashboard import metric_names

from prfaas_core import names

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "alerts" / "prfaas-rules.yaml"
TESTS = REPO / "alerts" / "tests" / "prfaas-rules.test.yaml"
ISSUE_ALERTS = {
    "link egress near cap": "PrfaasLinkEgressNearCap",
    "breaker open": "PrfaasRemoteBreakerOpen",
    "operator not reconciling": "PrfaasOperatorNotReconciling",
    "Prometheus data missing": "PrfaasOperatorPrometheusErrors",
    "TTFT SLO burn": "PrfaasTTFTSLOBurnFast",
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


def test_the_charts_copy_is_in_sync() -> None:
    copy = REPO / "helm" / "prfaas" / "files" / "prfaas-rules.yaml"
    assert copy.read_bytes() == RULES.read_bytes(), "run: python scripts/sync_chart_files.py"


RUNBOOK = REPO / "docs" / "runbook.md"
RUNBOOK_URL = "https://github.com/prfaas/prfaas/blob/main/docs/runbook.md#"


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
