"""Build the PrFaaS alert rules from one source (the rule list below) in two renderings:

- ``alerts/prfaas-rules.yaml``: the rules with the chart's default values (what ``promtool`` checks and unit-tests,
  what a Prometheus without the chart loads);
- ``helm/prfaas/files/prfaas-rules.yaml``: the same rules as a Helm template (the chart's PrometheusRule renders it
  with ``tpl``): every knob reads ``.Values.monitoring.prometheusRule``, and Prometheus' own ``{{ $labels.x }}``
  templates are escaped so that Helm passes them through.

The knobs (thresholds, ``for`` durations, windows, the runbook base URL) and their defaults live in
``helm/prfaas/values.yaml`` under ``monitoring.prometheusRule``; a rule names one as ``<<path>>`` (relative to
``monitoring.prometheusRule``). tests/integration/test_alerts.py checks that ``helm template`` with the default
values renders exactly ``alerts/prfaas-rules.yaml``. ``--check`` exits 1 when either file is stale
(``scripts/sync_chart_files.py`` writes and checks them too).

Every alert is per PD cluster (``namespace``, ``pd_cluster``: the labels the chart's monitors put on router, engine
and operator series) or per link, and none fires in a healthy region that runs only a gateway and PrFaaS engines
(region A): a missing-series alert compares what the operator or the gateway says exists with what is scraped.

Usage: python scripts/build_alerts.py [--check]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "alerts" / "prfaas-rules.yaml"
CHART_TEMPLATE = REPO / "helm" / "prfaas" / "files" / "prfaas-rules.yaml"
VALUES = REPO / "helm" / "prfaas" / "values.yaml"
KNOB = re.compile(r"<<([A-Za-z0-9_.]+)>>")
RUNBOOK = "<<runbookBaseUrl>>#"
PD = "namespace, pd_cluster"
"""A PD cluster's identity on every series: the object's namespace and name (the chart's monitors add both)."""


def _slo_burn(speed: str, severity: str, summary: str, description: str) -> dict[str, Any]:
    k = f"alerts.sloBurn{speed}"

    def ratio(window: str) -> str:
        return (
            f'  sum by ({PD}) (rate(prfaas_router_ttft_slo_total{{result="missed"}}[<<{k}.{window}>>]))\n'
            f"    / sum by ({PD}) (rate(prfaas_router_ttft_slo_total[<<{k}.{window}>>]))"
        )

    budget = f"  (<<{k}.factor>> * (1 - max by ({PD}) (prfaas_router_ttft_slo_objective_ratio)))"
    return {
        "alert": f"PrfaasTTFTSLOBurn{speed}",
        "expr": f"(\n{ratio('longWindow')}\n) > on ({PD})\n{budget}\nand on ({PD})\n"
        f"(\n{ratio('shortWindow')}\n) > on ({PD})\n{budget}\n",
        "for": f"<<{k}.for>>",
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "description": description},
    }


GROUPS: list[tuple[str, list[dict[str, Any]]]] = [
    (
        "prfaas.link",
        [
            {
                # The routers hold a link "scarce" while its measured egress (link total + their own in-flight
                # KV) stays above the scarce watermark of its cap (InterDCLink scarceWatermark x maxUtilization).
                "alert": "PrfaasLinkEgressNearCap",
                "expr": "max by (namespace, link) (prfaas_router_link_scarce) == 1",
                "for": "<<alerts.linkNearCap.for>>",
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": "Inter-DC link {{ $labels.link }} has run near its cap for <<alerts.linkNearCap.for>>",
                    "description": "Routers in {{ $labels.namespace }} have held link {{ $labels.link }} scarce for "
                    "<<alerts.linkNearCap.for>>: the threshold t is raised above t_min and fewer long requests are "
                    "prefilled remotely. If it persists, raise the link's capacity or maxUtilization, or add PD "
                    "prefill capacity (prfaas plan tells how much).",
                },
            },
            {
                # A fleet site's gateway books its links under the site's egress cap (siteEgressCapGbps), split
                # max-min fair over the links' demands; each replica exports its share of the cap and of the demand.
                "alert": "PrfaasSiteEgressCapBinding",
                "expr": "sum by (namespace, site) (prfaas_gateway_site_demand_gbps)\n"
                "  > on (namespace, site) sum by (namespace, site) (prfaas_gateway_site_cap_gbps)",
                "for": "<<alerts.siteCapBinding.for>>",
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": "Site {{ $labels.site }}'s links have asked more than its egress cap for "
                    "<<alerts.siteCapBinding.for>>",
                    "description": "The KV offered to the links of site {{ $labels.site }} in {{ $labels.namespace }} "
                    "has exceeded the site's egress cap (siteEgressCapGbps) for <<alerts.siteCapBinding.for>>: its "
                    "gateway shares the cap max-min fair between the links, so remote prefills wait for a window or "
                    "are prefilled locally or at another site. Raise siteEgressCapGbps, or move a region's traffic "
                    "to another site (prfaas plan on the fleet says where capacity pays most).",
                },
            },
            {
                # Gateway replicas lend each other their idle share of the link (gateway.admission.peers); a
                # replica that cannot reach a peer keeps only cap / replicas.
                "alert": "PrfaasGatewayPeersUnreachable",
                "expr": 'sum by (namespace, link) (rate(prfaas_gateway_loans_total{result="unreachable"}[5m])) > 0',
                "for": "<<alerts.gatewayPeersUnreachable.for>>",
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": "Gateway replicas on link {{ $labels.link }} cannot reach each other to share the link",
                    "description": "For <<alerts.gatewayPeersUnreachable.for>> gateway replicas on link "
                    "{{ $labels.link }} have failed to ask or give back share loans: each keeps only its own cap / "
                    "replicas, so the link carries less than its cap and long requests wait or are prefilled "
                    "locally. Check gateway.admission.peers, the gateway pods and their token.",
                },
            },
            {
                # A prefill's answer waited for room on the link until the engine's KV lease nearly ran out
                # (gateway.admission.kvLeaseSeconds): its prefill was wasted and the request prefilled again locally.
                "alert": "PrfaasGatewayHeldPastKvLease",
                "expr": "sum by (namespace, link) "
                '(increase(prfaas_gateway_admissions_total{result="kv_lease"}[<<alerts.gatewayHeldPastKvLease.window>>])) '
                "> 0",
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": "Gateway on link {{ $labels.link }} held prefill answers past the engines' KV lease",
                    "description": "In the last <<alerts.gatewayHeldPastKvLease.window>> the gateway on link "
                    "{{ $labels.link }} held at least one prefill answer for room on the link until 80 % of the "
                    "prefill engine's KV lease had passed, then answered 429 kv_lease: the remote prefill was "
                    "wasted and the request prefilled locally. Pulls stay on the wire far longer than booked "
                    "(routers that do not report their pulls, a link much slower than configured), or "
                    "kvLeaseSeconds is below the engines' lease.",
                },
            },
        ],
    ),
    (
        "prfaas.router",
        [
            {
                # Router replicas share their PD prefill books (--peers / --peers-dns).
                "alert": "PrfaasRouterReplicasUnreachable",
                "expr": f"sum by ({PD}, pod) (\n"
                '  rate(prfaas_router_replica_sync_total{result=~"unreachable|refused|unauthorized"}[5m])\n) > 0\n',
                "for": "<<alerts.routerReplicasUnreachable.for>>",
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": "Router {{ $labels.pod }} of PD cluster {{ $labels.namespace }}/{{ $labels.pd_cluster }} "
                    "cannot share its PD prefill books with its peer replicas",
                    "description": "For <<alerts.routerReplicasUnreachable.for>> router {{ $labels.pod }} has failed "
                    "to send its PD prefill books to a peer replica: the replicas count each other's local prefills "
                    "only one engine scrape late and may pile onto the same PD prefill instance, so local TTFTs "
                    "rise. Check the peers (--peers, --peers-dns: the chart's router-peers Service), the router "
                    "pods, the NetworkPolicy between them and their shared token (router.replicaSync.tokenSecret).",
                },
            },
            {
                "alert": "PrfaasRemoteBreakerOpen",
                "expr": f"max by ({PD}, remote) (prfaas_router_breaker_open) == 1",
                "for": "<<alerts.breakerOpen.for>>",
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": "PD cluster {{ $labels.namespace }}/{{ $labels.pd_cluster }}: circuit breaker to remote "
                    "PrFaaS cluster {{ $labels.remote }} open for <<alerts.breakerOpen.for>>",
                    "description": "The routers of {{ $labels.pd_cluster }} stopped sending prefills to "
                    "{{ $labels.remote }} after repeated failures (gateway unreachable, link cut or KV pulls timing "
                    "out); every long request is prefilled locally, so TTFT and PD load rise. Check the gateway's "
                    "/status, the link and the remote PrefillCluster's conditions.",
                },
            },
            # Each request is judged by the routers against its own TTFT objective (the PDCluster's slo: base +
            # per-1K-tokens slope x its prompt length), per PD cluster: one healthy cluster cannot hide a burning one.
            # The error budget is 1 - slo.objectiveRatio (the routers export it). Fast: 14.4x the budget over 1 h and
            # 5 min (2 % of a 30-day budget in an hour); slow: 6x over 6 h and 30 min (5 % in 6 hours).
            _slo_burn(
                "Fast",
                "critical",
                "PD cluster {{ $labels.namespace }}/{{ $labels.pd_cluster }}: requests miss their own TTFT "
                "objective <<alerts.sloBurnFast.factor>>x faster than the error budget allows",
                "Over both the last <<alerts.sloBurnFast.longWindow>> and the last <<alerts.sloBurnFast.shortWindow>>, "
                "the share of {{ $labels.pd_cluster }}'s requests whose first token came later than their own "
                "objective (the PDCluster's slo.ttft for their length) is above <<alerts.sloBurnFast.factor>>x the "
                "error budget (1 - slo.objectiveRatio); {{ $value | humanizePercentage }} missed over "
                "<<alerts.sloBurnFast.longWindow>>. See the dashboard's SLO row for that PD cluster: a local prefill "
                "queue points at role balance, a remote one at the PrFaaS cluster or the link.",
            ),
            _slo_burn(
                "Slow",
                "warning",
                "PD cluster {{ $labels.namespace }}/{{ $labels.pd_cluster }}: requests miss their own TTFT "
                "objective <<alerts.sloBurnSlow.factor>>x faster than the error budget allows",
                "The TTFT error budget of {{ $labels.pd_cluster }} burns <<alerts.sloBurnSlow.factor>>x too fast over "
                "<<alerts.sloBurnSlow.longWindow>> and <<alerts.sloBurnSlow.shortWindow>> "
                "({{ $value | humanizePercentage }} missed over <<alerts.sloBurnSlow.longWindow>>).",
            ),
        ],
    ),
    (
        "prfaas.operator",
        [
            {
                # The operator manages PD clusters (it exports their role counts) but reconciled none for a while.
                "alert": "PrfaasOperatorNotReconciling",
                "expr": "sum(prfaas_operator_role_instances) > 0\nunless on ()\n"
                'sum(increase(prfaas_operator_reconcile_duration_seconds_count{kind="PDCluster"}'
                "[<<alerts.operatorNotReconciling.window>>])) > 0\n",
                "for": "<<alerts.operatorNotReconciling.for>>",
                "labels": {"severity": "critical"},
                "annotations": {
                    "summary": "The PrFaaS operator has not reconciled any PDCluster for "
                    "<<alerts.operatorNotReconciling.window>>",
                    "description": "Role flips, router configuration and status are frozen. Check that one replica "
                    "holds the Lease (kubectl get lease), the operator's logs, and its access to the API server.",
                },
            },
            {
                # More changes of a PD cluster's prefill count in an hour than allowed: the long-term loop flips
                # back and forth (hysteresis or cooldown too small for the load's variability).
                "alert": "PrfaasRoleFlapping",
                "expr": 'changes(prfaas_operator_role_instances{role="prefill"}[1h]) > <<alerts.roleFlapping.maxChanges>>',
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": "PD cluster {{ $labels.namespace }}/{{ $labels.pd_cluster }} flips roles too often",
                    "description": "Its prefill count changed {{ $value }} times in the last hour (more than "
                    "<<alerts.roleFlapping.maxChanges>>). Every flip drains an instance; raise the PDCluster's "
                    "policy.hysteresisCycles or policy.cooldownSeconds.",
                },
            },
            {
                # Elastic capacity: the demand asks for more instances than scaling.maxInstances or the budget allow.
                "alert": "PrfaasScaleOutBlocked",
                "expr": "max by (namespace, pd_cluster, prefill_cluster, reason) "
                "(prfaas_operator_scaling_blocked) == 1",
                "for": "<<alerts.scaleOutBlocked.for>>",
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": "Scale-out of {{ $labels.namespace }}/"
                    "{{ $labels.pd_cluster }}{{ $labels.prefill_cluster }} is blocked by its {{ $labels.reason }}",
                    "description": "For <<alerts.scaleOutBlocked.for>> the demand asked for more instances than the "
                    "cluster's scaling.maxInstances or scaling.budgetPerHour allow; it runs at the bound and the TTFT "
                    "objective may be missed. Raise the bound or the budget, or accept the queueing "
                    "(status.scaling.reason says by how much).",
                },
            },
        ],
    ),
    (
        "prfaas.data",
        [
            {
                "alert": "PrfaasOperatorPrometheusErrors",
                "expr": "sum by (job) (rate(prfaas_operator_prometheus_errors_total[5m])) > 0",
                "for": "<<alerts.operatorPrometheusErrors.for>>",
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": "The PrFaaS operator's Prometheus reads fail or come back empty",
                    "description": "For <<alerts.operatorPrometheusErrors.for>> the long-term loop could not read "
                    "queue depths or link egress, so it holds its last decision (PDCluster condition "
                    "Degraded=True). Check the Prometheus URL and that the engine PodMonitor adds the pd_cluster "
                    "and role labels.",
                },
            },
            {
                # The operator's own gauge, selected by its scrape job (monitoring.prometheusRule.operatorJob): another
                # release's operator does not hide this one's absence.
                "alert": "PrfaasOperatorMetricsMissing",
                "expr": 'absent_over_time(prfaas_operator_leader{job=~"<<operatorJob>>"}'
                "[<<alerts.metricsMissing.window>>])",
                "for": "<<alerts.metricsMissing.for>>",
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": "No PrFaaS operator metrics in Prometheus for <<alerts.metricsMissing.window>>",
                    "description": 'No prfaas_operator_leader series of a scrape job matching "<<operatorJob>>": '
                    "the operator is down or Prometheus does not scrape it (monitoring.serviceMonitor.enabled in "
                    "the chart).",
                },
            },
            {
                # Per PD cluster the operator manages: its engines' queue gauge, as the PodMonitor labels it.
                "alert": "PrfaasEngineMetricsMissing",
                "expr": f"max by ({PD}) (prfaas_operator_role_instances) > 0\nunless on ({PD})\n"
                f'count by ({PD}) (max_over_time(vllm:num_requests_waiting{{pd_cluster!=""}}'
                "[<<alerts.metricsMissing.window>>]))\n",
                "for": "<<alerts.metricsMissing.for>>",
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": "No vLLM metrics of PD cluster {{ $labels.namespace }}/{{ $labels.pd_cluster }} "
                    "for <<alerts.metricsMissing.window>>",
                    "description": "The operator manages {{ $labels.pd_cluster }}, but no vllm:num_requests_waiting "
                    "series labelled with it was scraped: the long-term loop cannot balance its roles. Check the "
                    "engine PodMonitor (monitoring.podMonitor.enabled) and the engines' /metrics.",
                },
            },
            {
                # Per namespace that runs a prefill gateway: the PrFaaS engines behind it, as the PodMonitor labels
                # them (prefill_cluster).
                "alert": "PrfaasPrefillEngineMetricsMissing",
                "expr": "max by (namespace) (prfaas_gateway_insecure)\nunless on (namespace)\n"
                'count by (namespace) (max_over_time(vllm:num_requests_waiting{prefill_cluster!=""}'
                "[<<alerts.metricsMissing.window>>]))\n",
                "for": "<<alerts.metricsMissing.for>>",
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": "No vLLM metrics of the PrFaaS engines in {{ $labels.namespace }} for "
                    "<<alerts.metricsMissing.window>>",
                    "description": "A prefill gateway runs in {{ $labels.namespace }}, but no "
                    "vllm:num_requests_waiting series with a prefill_cluster label was scraped there: the "
                    "PrefillCluster's queue and the dashboard's remote-prefill row are blind. Check the engine "
                    "PodMonitor (monitoring.podMonitor.enabled) and the engines' /metrics.",
                },
            },
            {
                # Per PD cluster the operator manages: a router series every router exports (a gateway-only region
                # has no PD cluster, so nothing to miss there).
                "alert": "PrfaasRouterMetricsMissing",
                "expr": f"max by ({PD}) (prfaas_operator_role_instances) > 0\nunless on ({PD})\n"
                f"count by ({PD}) (max_over_time(prfaas_router_ready[<<alerts.metricsMissing.window>>]))\n",
                "for": "<<alerts.metricsMissing.for>>",
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": "No PrFaaS router metrics of PD cluster {{ $labels.namespace }}/{{ $labels.pd_cluster }} "
                    "for <<alerts.metricsMissing.window>>",
                    "description": "The operator manages {{ $labels.pd_cluster }}, but no prfaas_router_ready series "
                    "labelled with it was scraped: its routing, link state and TTFT cannot be watched or alerted on. "
                    "Check the routers (standalone or sidecars) and their monitors (monitoring.serviceMonitor, "
                    "monitoring.podMonitor), which add the pd_cluster label.",
                },
            },
        ],
    ),
]


def _runbook(alert: str) -> str:
    return f"{RUNBOOK}{alert.lower()}"


def values() -> dict[str, Any]:
    """The chart's defaults of the knobs (``monitoring.prometheusRule``)."""
    return dict(yaml.safe_load(VALUES.read_text())["monitoring"]["prometheusRule"])


def _lookup(knobs: dict[str, Any], path: str) -> Any:
    node: Any = knobs
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(f"monitoring.prometheusRule.{path} is not in {VALUES.relative_to(REPO)}")
        node = node[part]
    return node


def _doc() -> dict[str, Any]:
    groups = []
    for name, rules in GROUPS:
        out = []
        for rule in rules:
            r = dict(rule)
            # Prometheus templates without their inner spaces: a folded line never splits one
            notes = {k: re.sub(r"\{\{ (\S+) \}\}", r"{{\1}}", v) for k, v in rule["annotations"].items()}
            r["annotations"] = {**notes, "runbook_url": _runbook(rule["alert"])}
            out.append(r)
        groups.append({"name": name, "rules": out})
    return {"groups": groups}


def _map_strings(node: Any, fn: Any) -> Any:
    if isinstance(node, dict):
        return {k: _map_strings(v, fn) for k, v in node.items()}
    if isinstance(node, list):
        return [_map_strings(v, fn) for v in node]
    return fn(node) if isinstance(node, str) else node


class _Dumper(yaml.SafeDumper):
    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)  # block sequences indented under their key (yamllint's default)


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)

HEADER = """\
# PrFaaS alerts (Prometheus rule groups), GENERATED by scripts/build_alerts.py with the chart's default values
# (helm/prfaas/values.yaml, monitoring.prometheusRule): do not edit; change the script or the values.
# The prfaas chart renders the same rules from its values (files/prfaas-rules.yaml, a Helm template).
# Unit tests: `promtool test rules alerts/tests/prfaas-rules.test.yaml`. Metric names from prfaas_core/names.py.
#
# Labels the expressions rely on: `namespace` and `pd_cluster` (the object's namespace and name; the chart's
# PodMonitor adds pd_cluster/prefill_cluster/role to engine and sidecar series, its ServiceMonitor pd_cluster to
# the standalone routers' and keeps the operator's own namespace labels), `link` and `remote` (router and gateway
# series), `kind` (operator reconciles), `job` (the scrape job).
"""

CHART_HEADER = """\
# GENERATED by scripts/build_alerts.py: the PrFaaS alert rules as a Helm template (rendered with `tpl` by
# templates/prometheusrule.yaml; knobs under monitoring.prometheusRule). Do not edit.
"""


def _dump(doc: dict[str, Any], width: int) -> str:
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=width, allow_unicode=True)


def render_defaults() -> str:
    knobs = values()
    doc = _map_strings(_doc(), lambda s: KNOB.sub(lambda m: str(_lookup(knobs, m.group(1))), s))
    return HEADER + _dump(doc, 80)


def render_chart() -> str:
    knobs = values()

    def helm(s: str) -> str:
        s = s.replace("{{", '{{ "{{" }}')  # Prometheus' templates pass through Helm
        for path in KNOB.findall(s):
            _lookup(knobs, path)  # every knob has a default
        return KNOB.sub(lambda m: "{{ .Values.monitoring.prometheusRule." + m.group(1) + " }}", s)

    # no folded lines: a Go template action must stay on one line
    return CHART_HEADER + _dump(_map_strings(_doc(), helm), 100_000)


def stale() -> list[Path]:
    return [p for p, text in ((OUT, render_defaults()), (CHART_TEMPLATE, render_chart())) if _read(p) != text]


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


def write() -> int:
    changed = 0
    for path, text in ((OUT, render_defaults()), (CHART_TEMPLATE, render_chart())):
        if _read(path) != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed += 1
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a rendering is stale")
    args = parser.parse_args(argv)
    if args.check:
        for p in stale():
            print(f"stale: {p.relative_to(REPO)} (run: python scripts/build_alerts.py)", file=sys.stderr)
        return 1 if stale() else 0
    print(f"{write()} file(s) updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
