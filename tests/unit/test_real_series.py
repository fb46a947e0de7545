"""No default query, dashboard panel or alert reads a series only the emulators export: every metric name they
select is tagged in prfaas_core/names.py (EXPORTERS) with a component a real deployment runs (router,
gateway, operator, vllm), never ``emulator``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from prfaas_core import names
from prfaas_core.api.inter_dc_link import LinkMeasurementSpec
from prfaas_core.api.pd_cluster import PrometheusQueries
from prfaas_operator import observe

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_OWN = {"up"}
SUFFIXES = ("_bucket", "_sum", "_count", "_created")


def selected(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (template variables substituted first)."""
    text = re.sub(r"\$__rate_interval|\$__range|\$window", "1m", expr)
    text = re.sub(r"\$(\w+)", r"x", text)
    text = re.sub(r"\$\{(\w+)\}", r"x", text)
    found: set[str] = set()

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                found.add(node.name)
            for m in node.matchers.matchers if node.matchers else []:
                if m.name == "__name__":
                    found.update(m.value.split("|"))
        return True

    promql_parser.walk(promql_parser.parse(text), visit)
    return found


def exporter(name: str) -> str | None:
    if name in names.EXPORTERS:
        return names.EXPORTERS[name]
    for suffix in SUFFIXES:
        if name.endswith(suffix) and name.removesuffix(suffix) in names.EXPORTERS:
            return names.EXPORTERS[name.removesuffix(suffix)]
    return None


def default_queries() -> dict[str, str]:
    out = {f"PDCluster.spec.prometheus.queries.{k}": v for k, v in PrometheusQueries().model_dump().items()}
    out["InterDCLink.spec.measurement.egressQuery"] = LinkMeasurementSpec().egress_query
    out |= {f"operator FAMILIES[{k}]": v for k, v in observe.FAMILIES.items()}
    out["operator LINK_FAMILY"] = observe.LINK_FAMILY
    out["operator PREFILL_FAMILY"] = observe.PREFILL_FAMILY
    for crd in sorted((REPO / "crds").glob("*.yaml")):
        for path, value in _defaults(yaml.safe_load(crd.read_text()), ""):
            if re.match(r"(sum|avg|max|rate)\(", value):
                out[f"{crd.name} {path}"] = value
    return out


def _defaults(node: Any, path: str) -> list[tuple[str, str]]:
    """Every string ``default`` in a CRD's schema, with where it sits."""
    out: list[tuple[str, str]] = []
    if isinstance(node, dict):
        if isinstance(node.get("default"), str):
            out.append((path, node["default"]))
        for k, v in node.items():
            out += _defaults(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _defaults(v, f"{path}[{i}]")
    return out


def panel_queries() -> dict[str, str]:
    doc = json.loads((REPO / "dashboards" / "prfaas.json").read_text())
    return {
        f"panel {p['title']!r} {t['refId']}": t["expr"]
        for p in doc["panels"]
        if p["type"] != "row"
        for t in p["targets"]
    }


def alert_queries() -> dict[str, str]:
    rules = yaml.safe_load((REPO / "alerts" / "prfaas-rules.yaml").read_text())
    return {f"alert {r.get('alert') or r.get('record')}": r["expr"] for g in rules["groups"] for r in g["rules"]}


ALL = {**default_queries(), **panel_queries(), **alert_queries()}


def test_every_metric_constant_is_tagged_with_its_exporter() -> None:
    constants = {v for k, v in vars(names).items() if k.startswith(("METRIC_", "VLLM_")) and isinstance(v, str)}
    assert constants - set(names.EXPORTERS) == set()
    assert set(names.EXPORTERS.values()) <= {"router", "gateway", "operator", "vllm", "emulator"}


def test_the_crd_defaults_are_found() -> None:
    crd = [k for k in ALL if k.startswith("interdclinks.prfaas.io.yaml")]
    assert crd, "the InterDCLink CRD's default egress query was not found"


@pytest.mark.parametrize("where", sorted(ALL))
def test_no_default_query_panel_or_alert_reads_an_emulator_series(where: str) -> None:
    for name in selected(ALL[where]) - PROMETHEUS_OWN:
        tag = exporter(name)
        assert tag is not None, f"{where}: {name} is not a metric name of names.py (tag it with its exporter)"
        assert tag != "emulator", f"{where}: {name} is exported only by the emulators ({ALL[where]})"


def test_the_checker_catches_an_emulator_series() -> None:
    assert exporter("prfaas_engine_kv_bytes_sent_total") == "emulator"
    assert "prfaas_link_egress_bytes_total" in selected("sum(rate(prfaas_link_egress_bytes_total[1m]))")
