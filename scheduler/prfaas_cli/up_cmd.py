"""``prfaas up``: the whole system on one machine, no cluster — emulated PrFaaS engines behind the prefill
gateway, PD engines, the shaped link (KV bytes really cross it), the router, and the core's long-term loop
with a local observer and actuator (the operator plugs in Kubernetes ones); then runs a scenario in phases
(by default steady traffic, a shift to long prompts, a link squeeze, a recovery: prfaas_local/data/up-phases.yaml)
with a live view, and prints a summary per phase (SLO attainment, TTFT by route, egress vs cap, role flips,
t). With --serve it keeps the stack up for your own client instead (until Ctrl-C or SIGTERM).

Times are model seconds (wall seconds x --time-scale) unless they say wall."""

from __future__ import annotations

import argparse
from typing import Any

from prfaas_local.up import DEFAULT_SCENARIO, run

from .output import add_output_arg


def register(sub: Any) -> None:
    p = sub.add_parser(
        "up", help="run the whole system locally (emulated engines, link, router, loop)", description=__doc__
    )
    p.add_argument("--prfaas", type=int, help="PrFaaS (H200) engines (default 2; 1 with --engines vllm)")
    p.add_argument("--pd", type=int, help="PD (H20) engines (default 4; 2 with --engines vllm)")
    p.add_argument(
        "--scenario",
        metavar="FILE",
        help=f"phases of traffic and link conditions (YAML; default {DEFAULT_SCENARIO.name}, the same file as "
        "examples/05-up/phases.yaml)",
    )
    p.add_argument(
        "--load",
        type=float,
        help="instead of a scenario: one steady phase at this fraction of the planner's Λ_max (0.5 when only "
        "--duration is given)",
    )
    p.add_argument(
        "--duration",
        type=float,
        help="instead of a scenario: model seconds of steady traffic (240); with --engines vllm: wall seconds (60)",
    )
    p.add_argument("--link-gbps", type=float, help="link capacity at the start, model Gbps (scenario's; 100)")
    p.add_argument(
        "--link-scheduling",
        choices=("off", "gateway", "paced"),
        default="off",
        help="gateway: the PrFaaS gateway books every KV pull in its link calendar under the cap (source-side "
        "admission; what a PrefillCluster's spec.linkScheduling turns on); paced: that, and each PrFaaS "
        "instance's egress paced to cap / instances (egressPacing: PerInstance). Default off: the router's own "
        "ledger admits",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        help="model seconds per wall second (scenario's; 2: every engine, the link and the router share this "
        "machine's cores, and a faster clock turns their CPU time into model latency)",
    )
    p.add_argument("--output-tokens", type=int, help="output tokens per request (scenario's; 128 with --engines vllm)")
    p.add_argument("--trace", help="replay this trace (JSONL, prfaas_core.request.trace) instead of generating one")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--fleet",
        action="store_true",
        help="a fleet instead of one pair: 2 sites, 2 regions, 4 links (emulated engines), phases steady, a link "
        "cut, a site cap squeezed, a site drained (--duration: model seconds each, default 60)",
    )
    p.add_argument("--work-dir", help="where configs, logs and summary.json go (default: a temp dir)")
    add_output_arg(p, "table")
    p.add_argument(
        "--plot-dir",
        metavar="DIR",
        help="write up.png here (the phases shaded: TTFT by route vs the SLO, egress vs the cap, t and its "
        "floor, roles), and dashboard.png when a local Prometheus ran",
    )
    p.add_argument(
        "--serve",
        action="store_true",
        help="no built-in load: keep the stack up for your own OpenAI client (and Prometheus) until Ctrl-C; "
        "with --engines vllm the real engines serve (endpoints.json in the work dir)",
    )
    p.add_argument(
        "--prometheus",
        choices=("auto", "off"),
        default="auto",
        help="auto: start a local Prometheus scraping the stack (with the project's recording rules) when "
        "the prometheus binary is installed",
    )
    register_real_options(p)
    p.set_defaults(handler=run)


def register_real_options(p: argparse.ArgumentParser) -> None:
    """``prfaas up``'s options for real engines."""
    p.add_argument(
        "--engines",
        choices=("emulated", "vllm"),
        default="emulated",
        help="emulated engines (default) or real CPU vLLM engines with the tiny model (1 PrFaaS + 2 PD)",
    )
    p.add_argument(
        "--model",
        choices=("tiny", "hybrid"),
        default="tiny",
        help="with --engines vllm: the tiny dense model (default) or the tiny hybrid (Qwen3-Next: 3 gated-DeltaNet "
        "+ 1 full-attention layers; its engines' flags and the routers' profile from `prfaas profile`)",
    )
    p.add_argument(
        "--netns", action="store_true", help="with --engines vllm: the two regions in network namespaces (root)"
    )
    p.add_argument("--netns-mbit", type=float, default=40.0, help="the veth's tbf rate in Mbit/s (default 40)")
    p.add_argument(
        "--pin-prefill",
        type=int,
        help="with --engines vllm: pin the PD prefill count (the loop drains and flips toward it)",
    )
