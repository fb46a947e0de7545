"""Build the SRE's Grafana dashboard (dashboards/prfaas.json) from the panel list below, and copy it into the
prfaas chart (helm/prfaas/files/prfaas-dashboard.json). ``--check`` exits 1 when the committed JSON is stale.

Every expression uses only metric names a real deployment exports: our router, gateway and operator, and vLLM
(checked against the exporter tags in prfaas_core/names.py, where the link and engine emulators' own series are
tagged ``emulator`` and may not appear, and against a live scrape by tests/integration/test_dashboard.py, which
also runs each panel against a real Prometheus). Grafana macro:
``$__rate_interval`` (Grafana's own). The link's cap comes from the routers (``prfaas_router_link_cap_gbps``).

Usage: python scripts/build_dashboard.py [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "dashboards" / "prfaas.json"
CHART_COPY = REPO / "helm" / "prfaas" / "files" / "prfaas-dashboard.json"
UID = "prfaas-overview"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    targets: tuple[Target, ...]
    unit: str = "short"
    kind: str = "timeseries"
    width: int = 12
    height: int = 8
    overrides: tuple[dict[str, object], ...] = field(default_factory=tuple)


def _t(expr: str, legend: str) -> Target:
    return Target(" ".join(expr.split()), legend)


ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    (
        "Roles and routing",
        (
            Panel(
                "PD instances per role",
                "Prefill and decode instances of each PD cluster, as the operator's long-term loop sets them "
                "(drained instances count until flipped).",
                (_t("sum by (pd_cluster, role) (prfaas_operator_role_instances)", "{{pd_cluster}} {{role}}"),),
            ),
            Panel(
                "Role decisions by reason",
                "Long-term decisions per interval, by action (Hold, Drain, FlipToPrefill, FlipToDecode) and the "
                "kind of reason; the full reason is in the PDCluster's status and Events.",
                (
                    _t(
                        f"sum by (action, reason_kind) (increase(prfaas_operator_decisions_total[{RATE}]))",
                        "{{action}}: {{reason_kind}}",
                    ),
                ),
            ),
            Panel(
                "Routing decisions by route and reason",
                "Requests routed per second: remote (prefilled on the PrFaaS cluster) or local, and why "
                "(threshold, admission refused by the link cap, remote unavailable).",
                (
                    _t(
                        f"sum by (route, reason) (rate(prfaas_router_route_decisions_total[{RATE}]))",
                        "{{route}} ({{reason}})",
                    ),
                ),
                unit="reqps",
            ),
            Panel(
                "Routing threshold t",
                "The uncached-length threshold in force per router: requests longer than t are prefilled "
                "remotely. Never below t_min (the operator's); raised under link pressure.",
                (_t("max by (instance) (prfaas_router_threshold_tokens)", "t {{instance}}"),),
            ),
            Panel(
                "Offload fraction",
                "Share of routing decisions that sent the prefill to the PrFaaS cluster.",
                (
                    _t(
                        f'sum(rate(prfaas_router_route_decisions_total{{route="remote"}}[{RATE}])) '
                        f"/ sum(rate(prfaas_router_route_decisions_total[{RATE}]))",
                        "remote share",
                    ),
                ),
                unit="percentunit",
            ),
            Panel(
                "Requests by route and outcome",
                "Answered requests per second (ok, error, unavailable, rejected, cancelled).",
                (
                    _t(
                        f"sum by (route, outcome) (rate(prfaas_router_requests_total[{RATE}]))",
                        "{{route}} {{outcome}}",
                    ),
                ),
                unit="reqps",
            ),
        ),
    ),
    (
        "Inter-DC link",
        (
            Panel(
                "Link egress vs cap",
                "KV egress over each link (Gbps): the KV bytes this region's routers admitted (S_kv of the "
                "whole KV blocks holding the remote engine's prompt tokens; the InterDCLink's default egress "
                "source) and the routers' in-flight estimate, against the link's cap (capacity x the "
                "InterDCLink's maxUtilization, as the routers enforce it).",
                (
                    _t(
                        f"sum by (link) (rate(prfaas_router_remote_kv_bytes_total[{RATE}])) * 8 / 1e9",
                        "{{link}} admitted",
                    ),
                    _t("max by (link) (prfaas_router_link_egress_estimate_gbps)", "{{link}} router estimate"),
                    _t("max by (link) (prfaas_router_link_cap_gbps)", "{{link}} cap"),
                ),
                unit="Gbits",
            ),
            Panel(
                "Link utilisation and scarce state",
                "The routers' egress estimate / the link's cap, and 1 while the routers hold the link scarce "
                "(t raised, cross-cluster cache moves stopped).",
                (
                    _t(
                        "max by (link) (prfaas_router_link_egress_estimate_gbps) "
                        "/ max by (link) (prfaas_router_link_cap_gbps > 0)",
                        "{{link}} of cap",
                    ),
                    _t("max by (link) (prfaas_router_link_scarce)", "{{link}} scarce"),
                ),
                unit="percentunit",
            ),
            Panel(
                "KV transfers",
                "KV (Gbps) pulled by the decode engines of each PD cluster (vLLM's NixlConnector histogram, whole "
                "blocks, every source), served by the prefill gateway per link, and admitted by the routers per "
                "link.",
                (
                    _t(
                        # PrFaaS engines carry prefill_cluster, not pd_cluster: without the matcher they add an
                        # unlabelled line at 0
                        f'sum by (pd_cluster) (rate(vllm:nixl_bytes_transferred_sum{{pd_cluster!=""}}[{RATE}])) '
                        "* 8 / 1e9",
                        "pulled {{pd_cluster}}",
                    ),
                    _t(
                        f"sum by (link) (rate(prfaas_gateway_kv_egress_bytes_total[{RATE}])) * 8 / 1e9",
                        "gateway served {{link}}",
                    ),
                    _t(
                        f"sum by (link) (rate(prfaas_router_remote_kv_bytes_total[{RATE}])) * 8 / 1e9",
                        "routers admitted {{link}}",
                    ),
                ),
                unit="Gbits",
            ),
            Panel(
                "Gateway link calendar",
                "Per second, by link: the prefill gateway's admissions (booked, or declined: link_window, overloaded), "
                "the pulls it let onto the wire that ended (reported by the router, or by their lease), and the "
                "share loans between its replicas (borrowed, lent, refused, unreachable, expired).",
                (
                    _t(
                        f"sum by (link, result) (rate(prfaas_gateway_admissions_total[{RATE}]))",
                        "admissions {{link}} {{result}}",
                    ),
                    _t(f"sum by (link, end) (rate(prfaas_gateway_pulls_total[{RATE}]))", "pulls {{link}} {{end}}"),
                    _t(
                        f"sum by (link, result) (rate(prfaas_gateway_loans_total[{RATE}]))",
                        "loans {{link}} {{result}}",
                    ),
                ),
                unit="ops",
            ),
            Panel(
                "Gateway link shares",
                "Each gateway replica's share of its link's cap (1 / replicas, less what it lent its peers, plus what "
                "it borrowed; the replicas' shares sum to at most 1), and the p90 of how long prefill answers were "
                "held until their pull fit on the wire (right axis, model seconds).",
                (
                    _t("max by (link, pod) (prfaas_gateway_link_share)", "share {{link}} {{pod}}"),
                    _t(
                        "histogram_quantile(0.9, sum by (le, link) "
                        f"(rate(prfaas_gateway_pull_hold_seconds_bucket[{RATE}])))",
                        "held p90 {{link}}",
                    ),
                ),
                unit="percentunit",
                overrides=(
                    {
                        "matcher": {"id": "byRegexp", "options": "held p90.*"},
                        "properties": [
                            {"id": "unit", "value": "s"},
                            {"id": "custom.axisPlacement", "value": "right"},
                        ],
                    },
                ),
            ),
        ),
    ),
    (
        "Latency and queues",
        (
            Panel(
                "TTFT by route",
                "Time to first token seen by clients, p50 and p90, per route (router histogram).",
                (
                    _t(
                        f"histogram_quantile(0.9, sum by (le, route) "
                        f"(rate(prfaas_router_ttft_seconds_bucket[{RATE}])))",
                        "p90 {{route}}",
                    ),
                    _t(
                        f"histogram_quantile(0.5, sum by (le, route) "
                        f"(rate(prfaas_router_ttft_seconds_bucket[{RATE}])))",
                        "p50 {{route}}",
                    ),
                ),
                unit="s",
            ),
            Panel(
                "TPOT and end-to-end latency",
                "Time per output token on the engines (p90, by role: decodes serve both routes) and the "
                "router's end-to-end latency per route (p90).",
                (
                    _t(
                        "histogram_quantile(0.9, sum by (le, role) "
                        f"(rate(vllm:time_per_output_token_seconds_bucket[{RATE}])))",
                        "TPOT p90 {{role}}",
                    ),
                    _t(
                        f"histogram_quantile(0.9, sum by (le, route) (rate(prfaas_router_e2e_seconds_bucket[{RATE}])))",
                        "e2e p90 {{route}}",
                    ),
                ),
                unit="s",
            ),
            Panel(
                "Queue depth per stage",
                "Requests waiting on the engines of each stage: the PrFaaS cluster's prefill, the PD "
                "cluster's prefill and decode (labels from the engine PodMonitor), and in flight in the routers.",
                (
                    _t(
                        "sum by (prefill_cluster, pd_cluster, role) (vllm:num_requests_waiting)",
                        "waiting {{prefill_cluster}}{{pd_cluster}} {{role}}",
                    ),
                    _t("sum(prfaas_router_in_flight)", "router in flight"),
                ),
            ),
            Panel(
                "Running batch",
                "Requests in the running batch per stage.",
                (
                    _t(
                        "sum by (prefill_cluster, pd_cluster, role) (vllm:num_requests_running)",
                        "running {{prefill_cluster}}{{pd_cluster}} {{role}}",
                    ),
                ),
            ),
            Panel(
                "KV-cache usage",
                "Mean and highest KV-cache usage of the engines per stage (vLLM's vllm:kv_cache_usage_perc, "
                "1 = full): a full decode cache queues new decodes.",
                (
                    _t(
                        "avg by (prefill_cluster, pd_cluster, role) (vllm:kv_cache_usage_perc)",
                        "mean {{prefill_cluster}}{{pd_cluster}} {{role}}",
                    ),
                    _t(
                        "max by (prefill_cluster, pd_cluster, role) (vllm:kv_cache_usage_perc)",
                        "max {{prefill_cluster}}{{pd_cluster}} {{role}}",
                    ),
                ),
                unit="percentunit",
            ),
        ),
    ),
    (
        "Health",
        (
            Panel(
                "Remote breaker state",
                "1 while a router's circuit breaker to a remote PrFaaS cluster is open (every request is then "
                "prefilled locally).",
                (_t("max by (remote) (prfaas_router_breaker_open)", "{{remote}}"),),
            ),
            Panel(
                "Operator: leadership and reconciles",
                "1 on the replica holding the Lease; reconciles per second by kind.",
                (
                    _t("max by (instance) (prfaas_operator_leader)", "leader {{instance}}"),
                    _t(
                        f"sum by (kind) (rate(prfaas_operator_reconcile_duration_seconds_count[{RATE}]))",
                        "reconciles/s {{kind}}",
                    ),
                ),
            ),
            Panel(
                "Operator: reconcile duration and Prometheus reads",
                "p90 reconcile duration per kind; Prometheus queries and failed/empty reads per second (the "
                "long-term loop holds its decision while reads fail).",
                (
                    _t(
                        "histogram_quantile(0.9, sum by (le, kind) "
                        f"(rate(prfaas_operator_reconcile_duration_seconds_bucket[{RATE}])))",
                        "reconcile p90 {{kind}} (s)",
                    ),
                    _t(f"sum(rate(prfaas_operator_prometheus_queries_total[{RATE}]))", "queries/s"),
                    _t(
                        f"sum by (reason) (rate(prfaas_operator_prometheus_errors_total[{RATE}]))",
                        "errors/s {{reason}}",
                    ),
                ),
            ),
            Panel(
                "Router replicas: peers heard and books sent",
                "Per router replica, the other replicas whose PD prefill books it heard within 3 s (each counts the "
                "others' local prefills in its queues; fewer than replicas - 1 means it prices the PD queues from "
                "the engines' scrapes alone), and the books sent per second by result.",
                (
                    _t("max by (instance) (prfaas_router_replica_peers)", "peers heard {{instance}}"),
                    _t(
                        f"sum by (result) (rate(prfaas_router_replica_sync_total[{RATE}]))",
                        "books sent/s {{result}}",
                    ),
                ),
            ),
            Panel(
                "Scrape targets up",
                "Prometheus scrape health of every PrFaaS target.",
                (_t("sum by (job) (up)", "{{job}}"),),
            ),
        ),
    ),
)


def panel_json(panel: Panel, pid: int, x: int, y: int) -> dict[str, object]:
    return {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {
            "defaults": {"unit": panel.unit, "custom": {"lineWidth": 1, "fillOpacity": 10}},
            "overrides": list(panel.overrides),
        },
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": t.expr, "legendFormat": t.legend}
            for i, t in enumerate(panel.targets)
        ],
    }


def build() -> dict[str, object]:
    panels: list[dict[str, object]] = []
    pid, y = 1, 0
    for row_title, row_panels in ROWS:
        grid = {"h": 1, "w": 24, "x": 0, "y": y}
        panels.append({"id": pid, "type": "row", "title": row_title, "collapsed": False, "gridPos": grid})
        pid, y = pid + 1, y + 1
        x = 0
        for panel in row_panels:
            if x + panel.width > 24:
                x, y = 0, y + panel.height
            panels.append(panel_json(panel, pid, x, y))
            pid, x = pid + 1, x + panel.width
        y += 8
    return {
        "uid": UID,
        "title": "PrFaaS: cross-datacenter prefill",
        "description": "Roles over time with reasons, threshold t, link egress vs cap, TTFT by route, queues, "
        "breakers and operator health. Built by scripts/build_dashboard.py.",
        "tags": ["prfaas", "llm", "vllm"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-3h", "to": "now"},
        "annotations": {"list": []},
        "links": [],
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
            ]
        },
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when dashboards/prfaas.json is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        stale = [p for p in (OUT, CHART_COPY) if not p.exists() or p.read_text() != text]
        for p in stale:
            print(f"stale: {p.relative_to(REPO)} (run: python scripts/build_dashboard.py)", file=sys.stderr)
        return 1 if stale else 0
    for path in (OUT, CHART_COPY):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(f"wrote {OUT.relative_to(REPO)} and {CHART_COPY.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
