"""``prfaas up``'s results: the summary (the whole run and each phase: requests, SLO attainment, TTFT by
route, egress peak vs cap, the flips with their reasons and times, the ``t`` changes) as JSON and text, and
``up.png`` (the phases as shaded bands under every panel)."""

from __future__ import annotations

import itertools
from typing import Any

from prfaas_core.api import SloSpec
from prfaas_core.request.slo import ttft_objective_s

from .load import Result, summarize
from .plots import figure, png
from .scenario import Phase
from .up_session import Cycle, SessionState

FLIPS = ("FlipToDecode", "FlipToPrefill")
SETTLE_S = 10.0
"""Model seconds after a phase starts before its egress counts as settled under the phase's cap."""


def _requests(results: list[Result], slo: SloSpec) -> dict[str, Any]:
    out = summarize(results, slo).as_json()
    out["by_route"] = {
        route: summarize([r for r in results if r.route == route], slo).as_json()
        for route in sorted({r.route for r in results})
    }
    return out


def _cycle_json(c: Cycle) -> dict[str, Any]:
    return {
        "model_s": round(c.model_s, 1),
        "phase": c.phase,
        "action": c.action,
        "reason": c.reason,
        "roles": {"prefill": c.prefill, "decode": c.decode},
        "threshold_min_tokens": c.t_min,
        "threshold_in_force_tokens": c.t_in_force,
    }


def t_changes(st: SessionState) -> list[dict[str, Any]]:
    """Each change of the router's ``t`` in force (its own gauge), with the link state at the time."""
    out: list[dict[str, Any]] = []
    last: float | None = None
    for s in st.router:
        if s.threshold_tokens is not None and s.threshold_tokens != last:
            out.append({"model_s": round(s.model_s, 1), "tokens": int(s.threshold_tokens), "link_scarce": s.scarce})
            last = s.threshold_tokens
    return out


def phase_summary(st: SessionState, phase: Phase, slo: SloSpec) -> dict[str, Any]:
    """One phase: the requests that arrived in it, the egress and router samples inside its span."""
    results = [r for r in st.results if r.sent_at is not None and phase.contains(r.arrival_s)]
    series = st.egress_series()
    egress = [g for t, g in series if phase.contains(t)]
    # after the first SETTLE_S of the phase: a reshaped link's cap binds once the KV already in flight landed
    settled = [g for t, g in series if phase.contains(t) and t >= phase.start_s + SETTLE_S]
    router = [s for s in st.router if phase.contains(s.model_s)]
    ts = [s.threshold_tokens for s in router if s.threshold_tokens is not None]
    cycles = [c for c in st.cycles if c.phase == phase.name]
    roles = [(c.prefill, c.decode) for c in cycles]
    cap = phase.link_gbps * st.link_max_utilization
    return {
        "name": phase.name,
        "start_model_s": phase.start_s,
        "end_model_s": phase.end_s,
        "expect": phase.expect,
        "load": phase.load,
        "link_gbps": phase.link_gbps,
        "requests": _requests(results, slo),
        "egress_peak_gbps": round(max(egress), 3) if egress else 0.0,
        "egress_mean_gbps": round(sum(egress) / len(egress), 3) if egress else 0.0,
        "link_cap_gbps": round(cap, 3),
        "egress_peak_settled_gbps": round(max(settled), 3) if settled else 0.0,
        "egress_mean_settled_gbps": round(sum(settled) / len(settled), 3) if settled else 0.0,
        # 1-s windows above the cap by more than the relays' burst (one shaper grant each): admission books each
        # stream at most at the cap, but an unpaced pull runs at its relay's rate (vLLM's NixlConnector pulls at
        # wire speed), so overlapping pulls can run the link above it
        "egress_windows_over_cap": sum(g > cap + st.shaper_burst_gbit for g in settled),
        "link_scarce_share": round(sum(s.scarce for s in router) / len(router), 3) if router else 0.0,
        "router_threshold_tokens": {
            "min": int(min(ts)) if ts else None,
            "max": int(max(ts)) if ts else None,
            "last": int(ts[-1]) if ts else None,
        },
        "threshold_min_tokens": {
            "min": min((c.t_min for c in cycles if c.t_min is not None), default=None),
            "max": max((c.t_min for c in cycles if c.t_min is not None), default=None),
        },
        "roles_end": {"prefill": roles[-1][0], "decode": roles[-1][1]} if roles else None,
        "flips": [_cycle_json(c) for c in cycles if c.action in FLIPS],
        "cycles": len(cycles),
        "actions": _count(c.action for c in cycles),
    }


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def summary(st: SessionState, slo: SloSpec, wall_s: float) -> dict[str, Any]:
    """The run's JSON (the schema README and tests rely on: top-level as before, plus ``phases``)."""
    req = _requests(st.results, slo)
    by_route = req.pop("by_route")
    egress = [g for _, g in st.egress_series()]
    caps = [s.cap_gbps for s in st.router if s.cap_gbps]
    return {
        "time_unit": "model seconds (wall seconds x time_scale) unless a key says wall",
        "time_scale": st.time_scale,
        "requests": req,
        "by_route": by_route,
        "egress_mean_gbps": round(sum(egress) / len(egress), 3) if egress else 0.0,
        "egress_peak_gbps": round(max(egress), 3) if egress else 0.0,
        "egress_windows": "relays" if st.relay_egress else "sampled",
        "link_cap_gbps": max(caps) if caps else st.cap_gbps,
        "shaper_burst_gbit": round(st.shaper_burst_gbit, 3),
        "phases": [phase_summary(st, p, slo) for p in st.phases],
        "role_flips": [_cycle_json(c) for c in st.cycles if c.action in FLIPS],
        "threshold_changes": t_changes(st),
        "link_changes": [{"model_s": round(t, 1), "phase": n, "capacity_gbps": g} for t, n, g in st.link_changes],
        "wall_seconds": round(wall_s, 1),
        "errors": sorted({f"{r.status}: {r.error}" for r in st.results if r.status != 200})[:5],
        "last_decisions": [_cycle_json(c) for c in st.cycles[-5:]],
    }


def loop_summary(st: SessionState, counts: tuple[int, int], t_min: int, published: dict[str, Any]) -> dict[str, Any]:
    """Where the long-term loop left things: the roles, ``t_min``, its cycles, what the routers were told
    (``published``: the router config file) and the ``t`` in force at the router at the end."""
    last = next((s for s in reversed(st.router) if s.threshold_tokens is not None), None)
    last_t = last.threshold_tokens if last is not None else None
    return {
        "final_roles": {"prefill": counts[0], "decode": counts[1]},
        "threshold_tokens": t_min,
        "loop": {
            "cycles": len(st.cycles),
            "actions": _count(c.action for c in st.cycles),
            "published_threshold_min_tokens": published["thresholdMinTokens"],
            "router_threshold_tokens": last_t,
            # why the router's t may stand above t_min: its link is scarce, or its available-bandwidth estimate
            # bounds the capacity (a cap below the configured one)
            "router_link_scarce": last.scarce if last is not None else None,
            "router_link_cap_gbps": last.cap_gbps if last is not None else None,
        },
    }


def print_summary(out: dict[str, Any]) -> None:
    """The summary as text: the whole run, then one block per phase."""
    r = out["requests"]
    print(
        f"requests {r['requests']}, ok {r['ok']}, within SLO {r['meets_slo']} ({r['slo_attainment']:.1%}); "
        f"TTFT p50/p90 {r['ttft_p50_s']}/{r['ttft_p90_s']} s (model); {out['wall_seconds']} s wall"
    )
    for p in out["phases"]:
        pr = p["requests"]
        t = p["router_threshold_tokens"]
        roles = p["roles_end"]
        print(
            f"\n[{p['name']}] model {p['start_model_s']:g}-{p['end_model_s']:g} s, load {p['load']:g}, link "
            f"{p['link_gbps']:g} Gbps: {pr['requests']} requests, SLO {pr['slo_attainment']:.1%}"
        )
        for route, s in pr["by_route"].items():
            print(
                f"  {route:7s} {s['requests']:4d} requests, TTFT p50/p90 {s['ttft_p50_s']}/{s['ttft_p90_s']} s "
                f"(model), SLO {s['slo_attainment']:.1%}"
            )
        print(
            f"  egress peak {p['egress_peak_gbps']:.1f}, mean {p['egress_mean_gbps']:.2f} / cap {p['link_cap_gbps']:g}"
            f" Gbps, {p['egress_windows_over_cap']} settled windows over it beyond the burst (scarce "
            f"{p['link_scarce_share']:.0%} of the time); t at the router {t['min']}..{t['max']}; roles at the end "
            + (f"{roles['prefill']}P/{roles['decode']}D" if roles else "-")
        )
        for f in p["flips"]:
            print(f"  {f['action']} at {f['model_s']:g} s: {f['reason']}")
    ls = out.get("link_scheduling", {})
    if ls.get("admissions") is not None:
        booked = {k: round(v) for k, v in sorted(ls["admissions"].items())}
        pulls = {k: round(v) for k, v in sorted(ls["pulls"].items())}
        print(f"\nlink scheduled by the gateway ({ls['mode']}): windows {booked}; pulls ended {pulls}")
    el = out.get("elastic")
    for name, c in (el or {}).get("clusters", {}).items():
        print(
            f"\nelastic {name}: {c['start']} -> desired {c['peak_desired']} (ready {c['peak_ready']}) -> "
            f"{c['end_desired']}; after the demand step: scale-out asked at +{c['scale_out_asked_s']} s, ready at "
            f"+{c['scale_out_ready_s']} s; after the fall: scale-in at +{c['scale_in_asked_s']} s, back at the start "
            f"at +{c['back_to_start_s']} s (model)"
        )
    lp = out["loop"]
    print(
        f"\nflips {len(out['role_flips'])}, t changes {len(out['threshold_changes'])}; roles now "
        f"{out['final_roles']}, t_min {out['threshold_tokens']}; long-term loop {lp['cycles']} cycles "
        f"{lp['actions']}; t in force at the router {lp['router_threshold_tokens']}"
    )


# --- up.png -------------------------------------------------------------------------------------------------

BAND_COLOURS = ("#e8f0fe", "#fdecea", "#fff4e5", "#e6f4ea", "#f3e8fd", "#eeeeee")


def _bands(ax: Any, phases: list[Phase], label: bool) -> None:
    for i, p in enumerate(phases):
        ax.axvspan(p.start_s, p.end_s, color=BAND_COLOURS[i % len(BAND_COLOURS)], zorder=0, lw=0)
        if label:
            ax.text(
                (p.start_s + p.end_s) / 2, 1.01, p.name, transform=ax.get_xaxis_transform(),
                ha="center", va="bottom", fontsize=8,
            )  # fmt: skip


def _legend(ax: Any) -> None:
    """Every line named, beside the panel (never over the data)."""
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def render_plot(st: SessionState, slo: SloSpec) -> bytes:
    """Four panels over model time, the phases shaded: TTFT / SLO limit per request by route; egress against
    the cap; the router's ``t`` with its floor ``t_min``; the PD roles."""
    from matplotlib.ticker import FixedLocator, FormatStrFormatter, MaxNLocator, NullFormatter

    fig = figure(12, 15 if st.capacity else 12)
    axes = fig.subplots(5 if st.capacity else 4, 1, sharex=True)
    ax_ttft, ax_egress, ax_t, ax_roles = axes[:4]
    if st.capacity:  # elastic capacity: desired vs ready per cluster against demand
        from .up_elastic_report import draw_capacity

        _bands(axes[4], st.phases, label=False)
        draw_capacity(axes[4], st.capacity)
        _legend(axes[4])
    series = st.egress_series()
    seen = max([t for t, _ in series[-1:]] + [r[0] for r in st.timeline[-1:]] + [1.0])
    end = max([p.end_s for p in st.phases if p.end_s != float("inf")] + [seen])
    for ax in (ax_ttft, ax_egress, ax_t, ax_roles):
        _bands(ax, st.phases, label=ax is ax_ttft)
        ax.set_xlim(0, end)
    for route, marker in (("local", "o"), ("remote", "^")):
        pts = [
            ((r.sent_at - st.started) * st.time_scale, r.ttft_s / ttft_objective_s(slo, r.input_tokens))
            for r in st.results
            if r.route == route and r.ttft_s is not None and r.sent_at is not None
        ]
        if pts:
            ax_ttft.scatter([x for x, _ in pts], [y for _, y in pts], s=9, marker=marker, alpha=0.7, label=route)
    ax_ttft.axhline(1.0, color="k", ls="--", lw=1, label="SLO (TTFT = its limit)")
    ax_ttft.set_yscale("log")
    ax_ttft.yaxis.set_major_locator(FixedLocator([0.125, 0.25, 0.5, 1, 2, 4, 8, 16, 32]))
    ax_ttft.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax_ttft.yaxis.set_minor_formatter(NullFormatter())
    ax_ttft.set_ylabel("TTFT / SLO limit")
    ax_ttft.set_title("TTFT by route against the SLO (by arrival time)", pad=16)
    _legend(ax_ttft)

    source = "the relays' own 1-s model windows" if st.relay_egress else "1-s model windows, sampled"
    ax_egress.plot([t for t, _ in series], [g for _, g in series], lw=0.8, label=f"egress ({source})")
    caps = [(s.model_s, s.cap_gbps) for s in st.router if s.cap_gbps]
    if caps:
        ax_egress.step([x for x, _ in caps], [c for _, c in caps], where="post", color="k", ls="--", lw=1,
                       label="cap (capacity x maxUtilization)")  # fmt: skip
    scarce = [(s.model_s, s.scarce) for s in st.router]
    for (x0, on), (x1, _) in itertools.pairwise(scarce):
        if on:
            ax_egress.axvspan(x0, x1, ymin=0.95, ymax=1.0, color="tab:red", lw=0)
    if any(on for _, on in scarce):
        ax_egress.plot([], [], color="tab:red", lw=4, label="link scarce (router)")
    ax_egress.set_ylabel("Gbps (model)")
    # the scale of the traffic, not of an abundant cap far above it (that cap is named at the top edge)
    top = max(max((g for _, g in series), default=1.0), min((c for _, c in caps), default=1.0)) * 1.25
    ax_egress.set_ylim(0, top)
    for x, cap in caps:
        if cap > top:
            ax_egress.annotate(f"cap {cap:g} above", (x, top), xytext=(2, -10), textcoords="offset points", fontsize=7)
            break
    ax_egress.set_title("PrFaaS -> PD egress against the cap")
    _legend(ax_egress)

    ts = [(s.model_s, s.threshold_tokens / 1000) for s in st.router if s.threshold_tokens is not None]
    if ts:
        ax_t.step([x for x, _ in ts], [y for _, y in ts], where="post", label="t in force at the router")
    if st.timeline:
        ax_t.step([r[0] for r in st.timeline], [r[3] / 1000 for r in st.timeline], where="post", color="grey",
                  ls=":", lw=1.5, label="t_min (floor, from the long-term loop)")  # fmt: skip
    ax_t.set_ylabel("t (K tokens)")
    ax_t.set_ylim(bottom=0)
    ax_t.set_title("Routing threshold t (short-term) and its floor t_min (long-term)")
    _legend(ax_t)

    if st.timeline:
        xs = [r[0] for r in st.timeline]
        ax_roles.step(xs, [r[1] for r in st.timeline], where="post", label="PD prefill instances")
        ax_roles.step(xs, [r[2] for r in st.timeline], where="post", ls="--", label="PD decode instances")
    for cyc in st.cycles:
        if cyc.action in FLIPS:
            ax_roles.axvline(cyc.model_s, color="tab:purple", lw=0.8, ls=":")
    if any(c.action in FLIPS for c in st.cycles):
        ax_roles.plot([], [], color="tab:purple", lw=0.8, ls=":", label="role flip")
    ax_roles.set_ylabel("instances")
    ax_roles.set_ylim(0, max((max(r[1], r[2]) for r in st.timeline), default=1) + 1)
    ax_roles.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[-1].set_xlabel(f"model seconds (wall seconds x {st.time_scale:g})")
    ax_roles.set_title("PD roles from the long-term loop")
    _legend(ax_roles)
    fig.tight_layout()
    return png(fig)


__all__ = ["loop_summary", "phase_summary", "print_summary", "render_plot", "summary", "t_changes"]
