"""Build the SRE's Grafana dashboard (dashboards/prfaas.json) with grafana-foundation-sdk (Grafana's maintained
dashboards-as-code library; a test extra, not a runtime dependency) and copy it into the prfaas chart
(helm/prfaas/files/prfaas-dashboard.json). ``--check`` exits 1 when the committed JSON is stale.

Rows follow a request's path: the SLO per PD cluster first, then the router, the remote prefill (the PrFaaS
cluster behind the gateway), the local prefill (the PD cluster's prefill instances), the inter-DC link, the decode,
and the operator. Variables: datasource, namespace, PD cluster, PrefillCluster, link (each "All" = ``.*``).

Every expression reads only series a real deployment exports: our router, gateway and operator, and vLLM 0.32
(the exporter tags in prfaas_core/names.py; tests/unit/test_real_series.py), and every selector returns a series
from a live Prometheus scraping real vLLM engines, router and gateway (tests/real/test_real_prometheus.py) or the
observability stack with the operator (tests/integration/test_dashboard.py). Grafana macros: ``$__rate_interval``
and ``$__range`` (Grafana's own).

Usage: python scripts/build_dashboard.py [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as gcommon
from grafana_foundation_sdk.builders import dashboard as gdash
from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as mcommon
from grafana_foundation_sdk.models import dashboard as mdash

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "dashboards" / "prfaas.json"
CHART_COPY = REPO / "helm" / "prfaas" / "files" / "prfaas-dashboard.json"
UID = "prfaas-overview"
DATASOURCE = mdash.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
RANGE = "$__range"
VARIABLES = ("namespace", "pd_cluster", "prefill_cluster", "link")

NS = 'namespace=~"$namespace"'
PD = f'{NS}, pd_cluster=~"$pd_cluster"'
"""Router series: the chart's monitors label them with the PD cluster they front."""
LINK = f'{PD}, link=~"$link"'
GW = f'{NS}, link=~"$link"'
"""Gateway series (region A: no PD cluster)."""
SITE = f'{NS}, site=~"$prefill_cluster"'
"""A fleet site's gateway series (``site``: the PrefillCluster it fronts)."""
PD_ENGINE = f'{PD}, pd_cluster!=""'
PF_ENGINE = f'{NS}, prefill_cluster=~"$prefill_cluster", prefill_cluster!=""'
BY_PD = "namespace, pd_cluster"
ELASTIC = f'{NS}, pd_cluster=~"$pd_cluster", prefill_cluster=~"$prefill_cluster"'
"""Elastic capacity's series: a PD cluster's (prefill_cluster empty) or a site's (pd_cluster empty); "All" (.*)
matches the empty label too."""
PD_PREFILL = f'{PD_ENGINE}, role="prefill"'
PD_DECODE = f'{PD_ENGINE}, role="decode"'


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
    axis_label: str = ""
    right: tuple[tuple[str, str, str], ...] = ()
    """(legend regex, unit, axis label) of series drawn on a right-hand axis."""
    mappings: dict[str, tuple[str, str]] = field(default_factory=dict)
    """State panels: value -> (text, colour)."""
    min: float | None = None
    max: float | None = None


def _t(expr: str, legend: str) -> Target:
    return Target(" ".join(expr.split()), legend)


def _q(metric: str, sel: str) -> str:
    return f"{metric}{{{sel}}}"


def _slo(result: str | None, window: str, fn: str = "increase") -> str:
    """The SLO verdicts of each PD cluster over ``window``; one ``result`` is 0 (not absent) where none had it."""
    total = f"sum by ({BY_PD}) ({fn}({_q('prfaas_router_ttft_slo_total', PD)}[{window}]))"
    if result is None:
        return total
    sel = f'{PD}, result="{result}"'
    return f"(sum by ({BY_PD}) ({fn}({_q('prfaas_router_ttft_slo_total', sel)}[{window}])) or 0 * {total})"


def _burn(window: str) -> str:
    budget = f"(1 - max by ({BY_PD}) ({_q('prfaas_router_ttft_slo_objective_ratio', PD)}))"
    return f"({_slo('missed', window, 'rate')} / {_slo(None, window, 'rate')}) / on ({BY_PD}) {budget}"


def _p(q: float, metric: str, sel: str, by: str) -> str:
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{{{sel}}}[{RATE}])))"


def _gbps(metric: str, sel: str, by: str) -> str:
    return f"sum by ({by}) (rate({metric}{{{sel}}}[{RATE}])) * 8 / 1e9"


ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    (
        "SLO: TTFT objective per PD cluster",
        (
            Panel(
                "TTFT SLO attainment (dashboard range)",
                "Share of each PD cluster's requests whose first token came within their own objective (the "
                "PDCluster's slo.ttft for their prompt length, judged by the routers), over the dashboard's time "
                "range, beside the objective (slo.objectiveRatio).",
                (
                    _t(f"{_slo('met', RANGE)} / {_slo(None, RANGE)}", "{{pd_cluster}} attained"),
                    _t(
                        f"max by ({BY_PD}) ({_q('prfaas_router_ttft_slo_objective_ratio', PD)})",
                        "{{pd_cluster}} objective",
                    ),
                ),
                unit="percentunit",
                kind="stat",
                width=6,
            ),
            Panel(
                "Error budget left (dashboard range)",
                "1 - (missed share / error budget), per PD cluster, over the dashboard's time range (set it to the "
                "SLO period, e.g. 30 days): 100 % = nothing missed, 0 = the budget (1 - slo.objectiveRatio) spent, "
                "below 0 = overspent. The critical alert PrfaasTTFTSLOBurnFast reads the same counters.",
                (
                    _t(
                        f"1 - ({_slo('missed', RANGE)} / {_slo(None, RANGE)}) / on ({BY_PD}) "
                        f"(1 - max by ({BY_PD}) ({_q('prfaas_router_ttft_slo_objective_ratio', PD)}))",
                        "{{pd_cluster}}",
                    ),
                ),
                unit="percentunit",
                kind="stat",
                width=6,
            ),
            Panel(
                "Error-budget burn rate",
                "How many times faster than the budget allows each PD cluster misses its TTFT objective, over the "
                "burn alerts' short windows (5 m: PrfaasTTFTSLOBurnFast fires above 14.4 together with 1 h; 30 m: "
                "PrfaasTTFTSLOBurnSlow above 6 with 6 h). 1 = spending the budget exactly over the SLO period.",
                (_t(_burn("5m"), "{{pd_cluster}} 5m"), _t(_burn("30m"), "{{pd_cluster}} 30m")),
                unit="short",
                axis_label="x budget",
            ),
        ),
    ),
    (
        "Router: where each request goes",
        (
            Panel(
                "Routing decisions by route and reason",
                "Requests routed per second: remote (prefilled on the PrFaaS cluster) or local, and why "
                "(threshold, spill, admission refused by the link, remote unavailable).",
                (
                    _t(
                        f"sum by (pd_cluster, route, reason) (rate({_q('prfaas_router_route_decisions_total', PD)}[{RATE}]))",
                        "{{pd_cluster}} {{route}} ({{reason}})",
                    ),
                ),
                unit="reqps",
                width=8,
            ),
            Panel(
                "Fallbacks by reason",
                "Requests the router served another way than planned (a remote prefill that failed, was declined or "
                "whose KV could not be used, and went local), per second by reason: non-zero means the remote path "
                "is degraded.",
                (
                    _t(
                        f"sum by (pd_cluster, reason) (rate({_q('prfaas_router_fallbacks_total', PD)}[{RATE}]))",
                        "{{pd_cluster}} {{reason}}",
                    ),
                ),
                unit="reqps",
                width=8,
            ),
            Panel(
                "Threshold t, t_min and the uncached-length mix",
                "The routing threshold t in force (requests with more uncached prompt tokens go remote), its floor "
                "t_min (the operator's compute-balanced threshold; t is raised above it under link pressure), and "
                "the p50/p90 of the routed requests' uncached prompt lengths: how much of the mix lies above t.",
                (
                    _t(f"max by (pd_cluster) ({_q('prfaas_router_threshold_tokens', PD)})", "t {{pd_cluster}}"),
                    _t(f"max by (pd_cluster) ({_q('prfaas_router_threshold_min_tokens', PD)})", "t_min {{pd_cluster}}"),
                    _t(
                        _p(0.5, "prfaas_router_uncached_prompt_tokens", PD, "pd_cluster"), "uncached p50 {{pd_cluster}}"
                    ),
                    _t(
                        _p(0.9, "prfaas_router_uncached_prompt_tokens", PD, "pd_cluster"), "uncached p90 {{pd_cluster}}"
                    ),
                ),
                unit="short",
                width=8,
                axis_label="tokens",
            ),
            Panel(
                "TTFT by route",
                "Time to first token seen by clients, p50 and p90, per PD cluster and route (router histogram).",
                (
                    _t(_p(0.9, "prfaas_router_ttft_seconds", PD, "pd_cluster, route"), "p90 {{pd_cluster}} {{route}}"),
                    _t(_p(0.5, "prfaas_router_ttft_seconds", PD, "pd_cluster, route"), "p50 {{pd_cluster}} {{route}}"),
                ),
                unit="s",
                width=8,
            ),
            Panel(
                "Prefix hit rate",
                "Share of looked-up prompt tokens a cluster's instances already hold: the router's prediction by "
                "cluster (pd, prfaas), and what the engines' own prefix caches hit (vLLM, by PD cluster and role "
                "or PrefillCluster).",
                (
                    _t(
                        f"sum by (pd_cluster, cluster) (rate({_q('prfaas_router_prefix_hit_tokens_total', PD)}[{RATE}])) "
                        f"/ sum by (pd_cluster, cluster) (rate({_q('prfaas_router_prefix_query_tokens_total', PD)}[{RATE}]))",
                        "router {{pd_cluster}} {{cluster}}",
                    ),
                    _t(
                        f'sum by (pd_cluster, prefill_cluster, role) (rate({{__name__="vllm:prefix_cache_hits_total", {NS}}}[{RATE}])) '
                        f'/ sum by (pd_cluster, prefill_cluster, role) (rate({{__name__="vllm:prefix_cache_queries_total", {NS}}}[{RATE}]))',
                        "engines {{pd_cluster}}{{prefill_cluster}} {{role}}",
                    ),
                ),
                unit="percentunit",
                width=8,
                min=0,
                max=1,
            ),
            Panel(
                "Router replicas: peers heard",
                "Per router replica, the other replicas whose PD prefill books it heard within the expiry (each "
                "counts the others' local prefills in its queues; fewer than replicas - 1 means it prices the PD "
                "queues from the engines' scrapes alone: PrfaasRouterReplicasUnreachable).",
                (
                    _t(
                        f"max by (pd_cluster, instance) ({_q('prfaas_router_replica_peers', PD)})",
                        "{{pd_cluster}} {{instance}}",
                    ),
                ),
                width=8,
                axis_label="peers",
            ),
        ),
    ),
    (
        "Remote prefill: PrFaaS cluster behind the gateway",
        (
            Panel(
                "Gateway admissions by result",
                "Remote prefills the gateway's link calendar answered per second, by link: booked, or declined "
                "(link_window, overloaded, kv_lease); and the routers' claims it corrected (kv_bytes, decode_cached, "
                "slo_ttft: non-zero means a router, or a token holder, misstates a request).",
                (
                    _t(
                        f"sum by (link, result) (rate({_q('prfaas_gateway_admissions_total', GW)}[{RATE}]))",
                        "{{link}} {{result}}",
                    ),
                    _t(
                        f"sum by (link, claim) (rate({_q('prfaas_gateway_claims_corrected_total', GW)}[{RATE}]))",
                        "{{link}} corrected {{claim}}",
                    ),
                ),
                unit="ops",
                width=6,
            ),
            Panel(
                "PrFaaS engines: waiting and running",
                "Requests waiting and running on each PrefillCluster's engines (vLLM gauges, labelled by the chart's "
                "PodMonitor): a growing queue means the remote prefill is the bottleneck.",
                (
                    _t(
                        f"sum by (prefill_cluster) ({_q('vllm:num_requests_waiting', PF_ENGINE)})",
                        "waiting {{prefill_cluster}}",
                    ),
                    _t(
                        f"sum by (prefill_cluster) ({_q('vllm:num_requests_running', PF_ENGINE)})",
                        "running {{prefill_cluster}}",
                    ),
                ),
                width=6,
                axis_label="requests",
            ),
            Panel(
                "Gateway waits: booked window and held answers (p90)",
                "p90 of the waits the gateway booked before a prefill starts (admission), and of how long prefill "
                "answers were held until their pull fit on the wire (model seconds), by link.",
                (
                    _t(_p(0.9, "prfaas_gateway_admission_wait_seconds", GW, "link"), "booked wait p90 {{link}}"),
                    _t(_p(0.9, "prfaas_gateway_pull_hold_seconds", GW, "link"), "held p90 {{link}}"),
                ),
                unit="s",
                width=6,
            ),
            Panel(
                "Gateway link shares",
                "Each gateway replica's share of its link's cap (1 / replicas, less what it lent its peers, plus "
                "what it borrowed; the replicas' shares sum to at most 1). Stuck at 1 / replicas while the replicas "
                "cannot reach each other (PrfaasGatewayPeersUnreachable).",
                (
                    _t(
                        f"max by (link, pod, instance) ({_q('prfaas_gateway_link_share', GW)})",
                        "{{link}} {{pod}}{{instance}}",
                    ),
                ),
                unit="percentunit",
                width=6,
                min=0,
                max=1,
            ),
        ),
    ),
    (
        "Local prefill: the PD cluster's prefill instances",
        (
            Panel(
                "PD prefill: waiting and running",
                "Requests waiting and running on each PD cluster's prefill instances (vLLM gauges by role): the "
                "local path's queue.",
                (
                    _t(
                        f"sum by (pd_cluster) ({_q('vllm:num_requests_waiting', PD_ENGINE + ', role=' + chr(34) + 'prefill' + chr(34))})",
                        "waiting {{pd_cluster}}",
                    ),
                    _t(
                        f"sum by (pd_cluster) ({_q('vllm:num_requests_running', PD_ENGINE + ', role=' + chr(34) + 'prefill' + chr(34))})",
                        "running {{pd_cluster}}",
                    ),
                ),
                axis_label="requests",
            ),
            Panel(
                "Engine TTFT (p90) by stage",
                "vLLM's own time to first token on each stage's engines (the prefill's compute and queue, without the "
                "router's and the link's share).",
                (
                    _t(
                        _p(0.9, "vllm:time_to_first_token_seconds", PD_ENGINE, "pd_cluster, role"),
                        "{{pd_cluster}} {{role}}",
                    ),
                    _t(
                        _p(0.9, "vllm:time_to_first_token_seconds", PF_ENGINE, "prefill_cluster"), "{{prefill_cluster}}"
                    ),
                ),
                unit="s",
            ),
        ),
    ),
    (
        "Inter-DC link",
        (
            Panel(
                "Link egress vs cap (same window)",
                "KV egress over each link (Gbps) as a rate over the panel's window: served by the gateway (region "
                "A) and admitted by the routers (region B), against the link's cap averaged over the SAME window "
                "(capacity x maxUtilization, as the routers enforce it). Both sides are window means, so a burst "
                "within the shaper's allowance does not read as a breach.",
                (
                    _t(_gbps("prfaas_gateway_kv_egress_bytes_total", GW, "link"), "{{link}} gateway served"),
                    _t(_gbps("prfaas_router_remote_kv_bytes_total", LINK, "link"), "{{link}} routers admitted"),
                    _t(
                        f"max by (link) (avg_over_time({_q('prfaas_router_link_cap_gbps', LINK)}[{RATE}]))",
                        "{{link}} cap",
                    ),
                ),
                unit="Gbits",
                width=8,
            ),
            Panel(
                "Available vs configured bandwidth",
                "The bandwidth the routers' KV-pull timing says is available (model Gbps), the cap they hold the link "
                "to, and the gateway calendar's bookable bandwidth with its source (configured, or the routers' "
                "reports).",
                (
                    _t(
                        f"max by (link) ({_q('prfaas_router_link_available_gbps', LINK)})",
                        "{{link}} available (routers)",
                    ),
                    _t(f"max by (link) ({_q('prfaas_router_link_cap_gbps', LINK)})", "{{link}} cap"),
                    _t(
                        f"max by (link, source) ({_q('prfaas_gateway_link_available_gbps', GW)})",
                        "{{link}} gateway ({{source}})",
                    ),
                ),
                unit="Gbits",
                width=8,
            ),
            Panel(
                "Available-bandwidth source",
                "Which estimate the routers use now for each link: configured (nothing bounds it), streams (the "
                "KV pulls' timing) or stalled.",
                (
                    _t(
                        f"max by (link, source) ({_q('prfaas_router_link_available_source', LINK)}) == 1",
                        "{{link}} {{source}}",
                    ),
                ),
                kind="state-timeline",
                width=8,
                mappings={"1": ("in use", "blue")},
            ),
            Panel(
                "Link scarce",
                "Scarce while the routers' egress stays above the link's scarce watermark: t is raised above t_min "
                "and cross-cluster cache moves stop (PrfaasLinkEgressNearCap after 10 minutes).",
                (_t(f"max by (link) ({_q('prfaas_router_link_scarce', LINK)})", "{{link}}"),),
                kind="state-timeline",
                mappings={"0": ("ok", "green"), "1": ("scarce", "orange")},
            ),
            Panel(
                "KV moved: pulled by decodes, served, admitted",
                "KV (Gbps) pulled by the decode engines of each PD cluster (vLLM's NixlConnector histogram, whole "
                "blocks, every source), served by the gateway per link and admitted by the routers per link: they "
                "count the same bytes, so a gap means a component is not scraped.",
                (
                    _t(_gbps("vllm:nixl_bytes_transferred_sum", PD_ENGINE, "pd_cluster"), "pulled {{pd_cluster}}"),
                    _t(_gbps("prfaas_gateway_kv_egress_bytes_total", GW, "link"), "gateway served {{link}}"),
                    _t(_gbps("prfaas_router_remote_kv_bytes_total", LINK, "link"), "routers admitted {{link}}"),
                ),
                unit="Gbits",
            ),
            Panel(
                "Site egress cap: demand vs cap",
                "A fleet site's egress cap (PrefillCluster spec.siteEgressCapGbps, model Gbps) against the KV its "
                "links ask for (offered over the last 10 model seconds, booked or not), from the site's gateway "
                "(replicas summed). Demand above the cap: the cap binds and the links share it max-min fair "
                "(PrfaasSiteEgressCapBinding after 15m).",
                (
                    _t(f"sum by (site) ({_q('prfaas_gateway_site_demand_gbps', SITE)})", "{{site}} demand"),
                    _t(f"sum by (site) ({_q('prfaas_gateway_site_cap_gbps', SITE)})", "{{site}} cap"),
                ),
                unit="Gbits",
            ),
            Panel(
                "Site cap shares by link",
                "Each link's share of its site's egress cap now: the whole cap while the links' demands fit under "
                "it, max-min fair once they pass it (model Gbps; the link's calendar books under the lower of it and "
                "the link's own cap), beside what the link asks for.",
                (
                    _t(f"sum by (site, link) ({_q('prfaas_gateway_site_share_gbps', SITE)})", "{{link}} share"),
                    _t(f"sum by (site, link) ({_q('prfaas_gateway_site_demand_gbps', SITE)})", "{{link}} demand"),
                ),
                unit="Gbits",
            ),
        ),
    ),
    (
        "Decode",
        (
            Panel(
                "Inter-token latency and TPOT (p90)",
                "vLLM 0.32's time between output tokens (vllm:inter_token_latency_seconds) and each request's mean "
                "time per output token (vllm:request_time_per_output_token_seconds) on the decode engines, and the "
                "router's TPOT per route.",
                (
                    _t(
                        _p(0.9, "vllm:inter_token_latency_seconds", PD_DECODE, "pd_cluster"),
                        "inter-token {{pd_cluster}}",
                    ),
                    _t(
                        _p(
                            0.9,
                            "vllm:request_time_per_output_token_seconds",
                            PD_DECODE,
                            "pd_cluster",
                        ),
                        "request TPOT {{pd_cluster}}",
                    ),
                    _t(
                        _p(0.9, "prfaas_router_tpot_seconds", PD, "pd_cluster, route"),
                        "router TPOT {{pd_cluster}} {{route}}",
                    ),
                ),
                unit="s",
                width=8,
            ),
            Panel(
                "End-to-end latency (p90) by route",
                "The router's end-to-end request latency per route.",
                (_t(_p(0.9, "prfaas_router_e2e_seconds", PD, "pd_cluster, route"), "{{pd_cluster}} {{route}}"),),
                unit="s",
                width=8,
            ),
            Panel(
                "Decode: waiting, running, KV-cache usage",
                "Requests waiting and running on the decode engines, and their highest KV-cache usage (right axis; "
                "1 = full: a full decode cache queues new decodes).",
                (
                    _t(
                        f"sum by (pd_cluster) ({_q('vllm:num_requests_waiting', PD_DECODE)})",
                        "waiting {{pd_cluster}}",
                    ),
                    _t(
                        f"sum by (pd_cluster) ({_q('vllm:num_requests_running', PD_DECODE)})",
                        "running {{pd_cluster}}",
                    ),
                    _t(
                        f"max by (pd_cluster) ({_q('vllm:kv_cache_usage_perc', PD_DECODE)})",
                        "KV usage {{pd_cluster}}",
                    ),
                ),
                width=8,
                axis_label="requests",
                right=(("KV usage.*", "percentunit", "KV-cache usage"),),
            ),
            Panel(
                "Decode prompt tokens by source",
                "Prompt tokens the decode engines got per second, by source: external_kv_transfer (pulled from a "
                "prefill), local_cache_hit, local_compute (recomputed: should stay near 0 on a P/D decode).",
                (
                    _t(
                        f"sum by (pd_cluster, source) (rate({_q('vllm:prompt_tokens_by_source_total', PD_DECODE)}[{RATE}]))",
                        "{{pd_cluster}} {{source}}",
                    ),
                ),
                axis_label="tokens/s",
            ),
            Panel(
                "Remote breaker",
                "State of each router's circuit breaker to a remote PrFaaS cluster: open = every request of that PD "
                "cluster is prefilled locally (PrfaasRemoteBreakerOpen after 2 minutes).",
                (
                    _t(
                        f"max by (pd_cluster, remote) ({_q('prfaas_router_breaker_open', PD)})",
                        "{{pd_cluster}} -> {{remote}}",
                    ),
                ),
                kind="state-timeline",
                mappings={"0": ("closed", "green"), "1": ("open", "red")},
            ),
        ),
    ),
    (
        "Operator",
        (
            Panel(
                "PD instances per role",
                "Prefill and decode instances of each PD cluster, as the operator's long-term loop sets them "
                "(drained instances count until flipped).",
                (
                    _t(
                        f"sum by (pd_cluster, role) ({_q('prfaas_operator_role_instances', PD)})",
                        "{{pd_cluster}} {{role}}",
                    ),
                ),
                width=8,
                axis_label="instances",
            ),
            Panel(
                "Role decisions by reason",
                "Long-term decisions per interval, by action (Hold, Drain, FlipToPrefill, FlipToDecode) and the "
                "kind of reason; the full reason is in the PDCluster's status and Events.",
                (
                    _t(
                        f"sum by (pd_cluster, action, reason_kind) (increase({_q('prfaas_operator_decisions_total', PD)}[{RATE}]))",
                        "{{pd_cluster}} {{action}}: {{reason_kind}}",
                    ),
                ),
                width=8,
                axis_label="decisions",
            ),
            Panel(
                "Capacity: desired vs ready instances",
                "Elastic capacity (scaling.mode Operator or External): the instances each PD cluster (total) and each "
                "PrFaaS site should run and those serving; a desired count above ready is a scale-out starting (or "
                "pods Pending for want of GPUs). Blocked: a scale-out held at scaling.maxInstances or the budget "
                "(PrfaasScaleOutBlocked). The PD clusters' instances in service (both roles) are drawn in every mode.",
                (
                    _t(
                        f"max by (pd_cluster, prefill_cluster) ({_q('prfaas_operator_desired_instances', ELASTIC)})",
                        "desired {{pd_cluster}}{{prefill_cluster}}",
                    ),
                    _t(
                        f"max by (pd_cluster, prefill_cluster) ({_q('prfaas_operator_ready_instances', ELASTIC)})",
                        "ready {{pd_cluster}}{{prefill_cluster}}",
                    ),
                    _t(
                        f"sum by (pd_cluster) ({_q('prfaas_operator_role_instances', PD)})",
                        "in service {{pd_cluster}}",
                    ),
                    _t(
                        f"max by (pd_cluster, prefill_cluster, reason) "
                        f"({_q('prfaas_operator_scaling_blocked', ELASTIC)}) == 1",
                        "blocked by {{reason}} {{pd_cluster}}{{prefill_cluster}}",
                    ),
                ),
                width=24,
                axis_label="instances",
            ),
            Panel(
                "Operator: leader, reconciles, Prometheus errors",
                "1 on the replica holding the Lease; reconciles per second by kind; failed or empty Prometheus reads "
                "per second (the long-term loop holds its decision while they fail).",
                (
                    _t("max by (instance) (prfaas_operator_leader)", "leader {{instance}}"),
                    _t(
                        f"sum by (kind) (rate(prfaas_operator_reconcile_duration_seconds_count[{RATE}]))",
                        "reconciles/s {{kind}}",
                    ),
                    _t(
                        f"sum by (reason) (rate(prfaas_operator_prometheus_errors_total[{RATE}]))",
                        "errors/s {{reason}}",
                    ),
                ),
                width=8,
            ),
        ),
    ),
)


def _variable(name: str, label: str, query: str) -> gdash.QueryVariable:
    return (
        gdash.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(mdash.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(mdash.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(mdash.VariableOption(selected=True, text="All", value="$__all"))
    )


def _targets(panel: Panel) -> list[prometheus.Dataquery]:
    return [
        prometheus.Dataquery().ref_id(chr(ord("A") + i)).datasource(DATASOURCE).expr(t.expr).legend_format(t.legend)
        for i, t in enumerate(panel.targets)
    ]


def _panel(panel: Panel) -> Any:
    if panel.kind == "stat":
        b: Any = (
            stat.Panel()
            .reduce_options(gcommon.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
            .graph_mode(mcommon.BigValueGraphMode.AREA)
            .color_mode(mcommon.BigValueColorMode.VALUE)
        )
    elif panel.kind == "state-timeline":
        b = statetimeline.Panel().show_value(mcommon.VisibilityMode.AUTO).merge_values(True).line_width(0)
        value_map = mdash.ValueMap(
            options={
                v: mdash.ValueMappingResult(text=text, color=color, index=i)
                for i, (v, (text, color)) in enumerate(panel.mappings.items())
            }
        )
        b = b.mappings([value_map])
    else:
        b = (
            timeseries.Panel()
            .line_width(1)
            .fill_opacity(10)
            .legend(
                gcommon.VizLegendOptions()
                .display_mode(mcommon.LegendDisplayMode.LIST)
                .placement(mcommon.LegendPlacement.BOTTOM)
                .show_legend(True)
            )
            .tooltip(gcommon.VizTooltipOptions().mode(mcommon.TooltipDisplayMode.MULTI).sort(mcommon.SortOrder.NONE))
        )
        if panel.axis_label:
            b = b.axis_label(panel.axis_label)
        for regex, unit, label in panel.right:
            b = b.override_by_regexp(
                regex,
                [
                    mdash.DynamicConfigValue(id_val="unit", value=unit),
                    mdash.DynamicConfigValue(id_val="custom.axisPlacement", value="right"),
                    mdash.DynamicConfigValue(id_val="custom.axisLabel", value=label),
                ],
            )
    b = b.title(panel.title).description(panel.description).datasource(DATASOURCE).unit(panel.unit)
    b = b.height(8).span(panel.width).targets(_targets(panel))
    if panel.min is not None:
        b = b.min(panel.min)
    if panel.max is not None:
        b = b.max(panel.max)
    return b


def build() -> dict[str, Any]:
    d = (
        gdash.Dashboard("PrFaaS: cross-datacenter prefill")
        .uid(UID)
        .description(
            "Per PD cluster and link, along a request's path: the TTFT SLO and its error budget, the router's "
            "decisions and fallbacks, the remote (PrFaaS) and local prefill, the inter-DC link against its cap, the "
            "decode, and the operator. Built by scripts/build_dashboard.py (grafana-foundation-sdk)."
        )
        .tags(["prfaas", "llm", "vllm"])
        .timezone("browser")
        .editable()
        .tooltip(mdash.DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .time("now-3h", "now")
        .with_variable(gdash.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(_variable("namespace", "Namespace", "label_values(prfaas_router_ready, namespace)"))
        .with_variable(
            _variable(
                "pd_cluster", "PD cluster", 'label_values(prfaas_router_ready{namespace=~"$namespace"}, pd_cluster)'
            )
        )
        .with_variable(
            _variable(
                "prefill_cluster",
                "PrefillCluster",
                'label_values(vllm:num_requests_waiting{namespace=~"$namespace"}, prefill_cluster)',
            )
        )
        .with_variable(
            _variable(
                "link",
                "Link",
                'label_values({__name__=~"prfaas_router_link_cap_gbps|prfaas_gateway_link_share", '
                'namespace=~"$namespace"}, link)',
            )
        )
    )
    for row_title, panels in ROWS:
        d = d.with_row(gdash.Row(row_title))
        for panel in panels:
            d = d.with_panel(_panel(panel))
    doc: dict[str, Any] = json.loads(json.dumps(d.build(), cls=JSONEncoder))
    for i, p in enumerate(doc["panels"], start=1):
        p["id"] = i
    return doc


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
