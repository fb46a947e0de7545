"""A comparison as JSON-ready data and as a readable table (the CLI prints them; no I/O here).

JSON keys (``prfaas simulate --output json``): one object per deployment under its name
(``homogeneous_pd``, ``naive_heterogeneous``, ``prfaas_pd_static``, ``prfaas_pd``, ``oblivious_pd``) with at least
``throughput_rps``, ``goodput_rps``, ``ttft_p90_s``, ``egress_mean_gbps``, ``egress_peak_gbps``; the link's
``link_cap_gbps`` (capacity × maxUtilization, at the start); ``ratios`` of goodput and throughput; and
``static_splits`` when the scenario compares them.
"""

from __future__ import annotations

import math
from typing import Any

from .search import Comparison, DeploymentReport, StaticSplitReport

SERIES_STEP_S = 10
"""The per-second series are thinned to one sample every this many seconds in JSON."""


def _num(x: float | None, digits: int = 4) -> float | None:
    if x is None or math.isnan(x) or math.isinf(x):
        return None
    return round(x, digits)


def deployment_to_dict(rep: DeploymentReport, with_series: bool = True) -> dict[str, Any]:
    s, r, cfg = rep.reference, rep.result, rep.config
    ser = r.series
    out: dict[str, Any] = {
        "throughput_rps": _num(rep.throughput_rps),
        "goodput_rps": _num(rep.goodput_rps),
        "throughput_stage": rep.throughput_stage,
        "planner_throughput_rps": _num(rep.planner_rps),
        "planner_binding": rep.planner_binding or None,
        "ttft_mean_s": _num(s.ttft_mean_s),
        "ttft_p50_s": _num(s.ttft_p50_s),
        "ttft_p90_s": _num(s.ttft_p90_s),
        "ttft_p99_s": _num(s.ttft_p99_s),
        "tpot_mean_s": _num(s.tpot_mean_s),
        "slo_attainment": _num(s.slo_attainment),
        "egress_mean_gbps": _num(s.egress_mean_gbps),
        "egress_peak_gbps": _num(s.egress_peak_gbps),
        "offload_fraction": _num(s.offload_fraction),
        "link_waits": {
            "waited": r.link_waits,
            "share": _num(r.link_waits / r.n_requests) if r.n_requests else None,
            "wait_mean_s": _num(sum(r.link_wait_s) / len(r.link_wait_s)) if r.link_wait_s else None,
            "wait_max_s": _num(max(r.link_wait_s)) if r.link_wait_s else None,
        }
        if cfg.link_windows
        else None,
        "role_flips": s.role_flips,
        "utilization": {
            "prfaas": _num(s.util_prfaas),
            "pd_prefill": _num(s.util_pd_prefill),
            "decode": _num(s.util_decode),
        },
        "instances": {
            "prfaas": cfg.n_prfaas,
            "prefill_start": cfg.n_prefill,
            "decode_start": cfg.n_decode,
            "prefill_end": ser.n_prefill[-1] if ser.n_prefill else cfg.n_prefill,
            "decode_end": ser.n_decode[-1] if ser.n_decode else cfg.n_decode,
        },
        "threshold_tokens_start": cfg.threshold_tokens if cfg.routing == "threshold" else None,
        "requests": s.arrived,
        "completed": s.completed,
        "prefix_hit_tokens": s.prefix_hit_tokens,
        "prefix_lost_to_linear_state_tokens": s.prefix_lost_to_linear_tokens,
        "cache_move_bytes": _num(r.cache_move_bytes, 0),
        "events": s.events,
        "probes": [
            {
                "rate_rps": _num(p.rate_rps),
                "stable": p.stable,
                "slo_attainment": _num(p.attainment),
                "growing_stage": p.growing_stage,
                "prefill_end": p.prefill_end,
                "decode_end": p.decode_end,
            }
            for p in sorted(rep.probes, key=lambda p: p.multiplier)
        ],
        "role_decisions": [
            {
                "time_s": round(e.time_s, 1),
                "action": e.action,
                "reason": e.reason,
                "prefill": e.n_prefill,
                "decode": e.n_decode,
                "threshold_min_tokens": e.threshold_min_tokens,
            }
            for e in r.role_events
            if e.action != "Hold"
        ],
    }
    if with_series:
        k = SERIES_STEP_S
        out["series"] = {
            "time_s": ser.time_s[::k],
            "egress_gbps": [round(x, 3) for x in ser.egress_gbps[::k]],
            "capacity_gbps": ser.capacity_gbps[::k],
            "threshold_tokens": ser.threshold_tokens[::k],
            "prefill": ser.n_prefill[::k],
            "decode": ser.n_decode[::k],
            "in_system": ser.in_system[::k],
        }
    return out


def static_to_dict(st: StaticSplitReport) -> dict[str, Any]:
    best_att = st.attainment[st.best_prefill]
    out: dict[str, Any] = {
        "slo_attainment": {f"{n}P": _num(a) for n, a in sorted(st.attainment.items())},
        "goodput_rps": {f"{n}P": _num(g) for n, g in sorted(st.goodput_rps.items())} or None,
        "best_prefill": st.best_prefill,
        "best_slo_attainment": _num(best_att),
        "prfaas_pd_slo_attainment": _num(st.live_attainment),
        "attainment_ratio": _num(st.live_attainment / best_att) if best_att > 0 else None,
    }
    best_good = st.goodput_rps.get(st.best_prefill)
    if best_good and st.live_goodput_rps is not None:
        out["goodput_ratio"] = _num(st.live_goodput_rps / best_good)
    return out


def comparison_to_dict(c: Comparison, with_series: bool = True) -> dict[str, Any]:
    p = c.prepared
    sc = p.scenario
    out: dict[str, Any] = {
        "scenario": sc.name,
        "seed": sc.seed,
        "duration_s": sc.duration_seconds,
        "mean_rate_rps": _num(p.mean_rate_rps),
        "link_capacity_gbps": sc.link.capacity_gbps,
        "link_cap_gbps": _num(p.link_cap_gbps),
        "planner_threshold_tokens": round(p.plan.prfaas_pd.point.split.threshold_tokens),
    }
    for name, rep in c.deployments.items():
        out[name] = deployment_to_dict(rep, with_series)
    ratios: dict[str, float | None] = {}
    live = c.deployments.get("prfaas_pd")
    for base in ("homogeneous_pd", "naive_heterogeneous", "prfaas_pd_static", "oblivious_pd"):
        other = c.deployments.get(base)
        if live is None or other is None:
            continue
        for metric in ("goodput_rps", "throughput_rps"):
            a, b = getattr(live, metric), getattr(other, metric)
            ratios[f"prfaas_pd_vs_{base}_{metric[:-4]}"] = _num(a / b) if a is not None and b else None
    if ratios:
        out["ratios"] = ratios
    if c.static_splits is not None:
        out["static_splits"] = static_to_dict(c.static_splits)
    return out


def _fmt(x: float | None, spec: str) -> str:
    return "—" if x is None or math.isnan(x) else format(x, spec)


def render_table(c: Comparison) -> str:
    """The comparison side by side, one column per deployment."""
    p = c.prepared
    sc = p.scenario
    reps = list(c.deployments.values())
    rows: list[tuple[str, ...]] = [("", *(r.name for r in reps))]

    def row(label: str, values: list[str]) -> None:
        rows.append((label, *values))

    row("Instances PrFaaS / P / D", [f"{r.config.n_prfaas} / {r.config.n_prefill} / {r.config.n_decode}" for r in reps])
    row("Throughput (req/s)", [_fmt(r.throughput_rps, ".2f") for r in reps])
    row("  planner Λ_max (req/s)", [_fmt(r.planner_rps, ".2f") for r in reps])
    row("  bottleneck sim / planner", [f"{r.throughput_stage or '—'} / {r.planner_binding or '—'}" for r in reps])
    row(f"Goodput (req/s, {sc.search.attainment:.0%} SLO)", [_fmt(r.goodput_rps, ".2f") for r in reps])
    row(f"At {p.mean_rate_rps:.2f} req/s: SLO met", [_fmt(r.reference.slo_attainment, ".1%") for r in reps])
    row(
        "TTFT mean / P50 (s)",
        [f"{_fmt(r.reference.ttft_mean_s, '.2f')} / {_fmt(r.reference.ttft_p50_s, '.2f')}" for r in reps],
    )
    row(
        "TTFT P90 / P99 (s)",
        [f"{_fmt(r.reference.ttft_p90_s, '.2f')} / {_fmt(r.reference.ttft_p99_s, '.2f')}" for r in reps],
    )
    row("TPOT (ms)", [_fmt(r.reference.tpot_mean_s * 1000, ".1f") for r in reps])
    row(
        f"Egress mean / peak (Gbps; cap {p.link_cap_gbps:g})",
        [f"{r.reference.egress_mean_gbps:.1f} / {r.reference.egress_peak_gbps:.1f}" for r in reps],
    )
    row("Offload fraction", [f"{r.reference.offload_fraction:.1%}" for r in reps])
    row("Role flips", [str(r.reference.role_flips) for r in reps])
    row(
        "Utilisation PrFaaS / PD-P / PD-D",
        [
            f"{r.reference.util_prfaas:.0%} / {r.reference.util_pd_prefill:.0%} / {r.reference.util_decode:.0%}"
            for r in reps
        ],
    )
    widths = [max(len(rw[i]) for rw in rows) for i in range(len(rows[0]))]
    lines = [
        f"Scenario {sc.name} (seed {sc.seed}): {sc.duration_seconds:g} s at a mean {p.mean_rate_rps:.2f} req/s; "
        f"link {sc.link.capacity_gbps:g} Gbps, cap {p.link_cap_gbps:g} Gbps",
        "",
    ]
    for i, rw in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[j]) for j, cell in enumerate(rw)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    live = c.deployments.get("prfaas_pd")
    if live is not None and live.goodput_rps:
        for base in ("homogeneous_pd", "naive_heterogeneous", "oblivious_pd"):
            other = c.deployments.get(base)
            if other is not None and other.goodput_rps:
                lines.append(f"prfaas_pd goodput = {live.goodput_rps / other.goodput_rps:.2f}× {base}")
    st = c.static_splits
    if st is not None:
        lines.append("")
        cells = ", ".join(f"{n}P {a:.1%}" for n, a in sorted(st.attainment.items()))
        lines.append(f"Static splits (SLO met at the scenario's rates): {cells}")
        best = st.attainment[st.best_prefill]
        ratio = st.live_attainment / best if best > 0 else math.inf
        lines.append(
            f"prfaas_pd with live role flips: {st.live_attainment:.1%} vs best static ({st.best_prefill}P) "
            f"{best:.1%} = {ratio:.2f}×"
        )
    return "\n".join(lines)
