"""The fleet comparison's report (``prfaas simulate`` on a fleet scenario, ``benchmarks/fleet_routing.py``): per
phase the goodput of fleet routing and of static pairing (:func:`~.fleet.goodput`), their ratio, the steady-state
difference, and the largest 1-s-window egress of every link and site over every probe against its cap.

Whether the static pairing is **balanced** (:func:`balanced_pairing`) says what the steady phase shows: on an
unbalanced pairing (``fleet.yaml``: two regions on one site, one on the other) fleet routing gains by moving load off
the loaded site; on a balanced one (``fleet-balanced.yaml``: one region per site) there is nothing to move, and fleet
routing must cost nothing: its steady goodput at least :data:`STEADY_FLOOR` of static pairing's."""

from __future__ import annotations

from typing import Any

from .fleet import FLEET_MODES, goodput
from .fleet_config import FleetScenario, FleetSpec

STEADY_FLOOR = 0.98
"""On a balanced static pairing, fleet routing's steady goodput is at least this share of static pairing's (issue
50: within 2 %)."""


def balanced_pairing(fleet: FleetSpec) -> bool:
    """The static pairing binds every region, every site serves as many regions, and the sites are alike (the same
    hardware, instances and egress cap) as are the regions and their paired links: nothing to gain by moving load."""
    pairing = fleet.static_pairing
    if set(pairing) != {r.name for r in fleet.regions}:
        return False
    per_site = [sum(1 for s in pairing.values() if s == site.name) for site in fleet.sites]
    sites = {(s.accelerator, s.instances, s.site_egress_cap_gbps) for s in fleet.sites}
    regions = {(r.accelerator, r.instances, r.prefill_instances) for r in fleet.regions}
    paired = {
        (ln.capacity_gbps, ln.max_utilization, ln.threshold_tokens)
        for ln in fleet.links
        if pairing.get(ln.region) == ln.site
    }
    return len(set(per_site)) == 1 and len(sites) == len(regions) == len(paired) == 1


def measure(scn: FleetScenario, duration_s: float | None = None, precision: float | None = None) -> dict[str, Any]:
    """Both modes' goodput in every phase (``duration_s``/``precision``: the search's, default the scenario's)."""
    fleet = scn.fleet
    rate = fleet.rate_per_second
    links = {ln.name: ln for ln in fleet.links}
    site_caps = {s.name: s.site_egress_cap_gbps for s in fleet.sites}
    phases: list[dict[str, Any]] = []
    over: list[str] = []
    for phase in fleet.phases:
        row: dict[str, Any] = {"phase": phase.name}
        caps = {}
        for name, ln in links.items():
            change = phase.links.get(name)
            gbps = ln.capacity_gbps if change is None or change.capacity_gbps is None else change.capacity_gbps
            caps[name] = gbps * ln.max_utilization
        for mode in FLEET_MODES:
            g = goodput(scn, phase, mode, duration_s, precision)
            row[mode] = {
                "multiplier": round(g.multiplier, 4),
                "per_region_rps": round(g.multiplier * rate, 4),
                "probes": g.probes,
                "remote_by_site": dict(sorted(g.best.remote.items())) if g.best else {},
                "link_peak_gbps": {k: round(v, 3) for k, v in g.link_peaks.items()},
                "site_peak_gbps": {k: round(v, 3) for k, v in g.site_peaks.items()},
            }
            for name, peak in g.link_peaks.items():
                if peak > caps[name] + 1e-6:
                    over.append(f"{phase.name}/{mode} link {name}: {peak:.3f} > {caps[name]:.3f} Gbps")
            for name, peak in g.site_peaks.items():
                cap = site_caps[name]
                if cap is not None and peak > cap + 1e-6:
                    over.append(f"{phase.name}/{mode} site {name}: {peak:.3f} > {cap:.3f} Gbps")
        row["link_cap_gbps"] = caps
        static = row["static"]["multiplier"]
        row["ratio"] = round(row["fleet"]["multiplier"] / static, 3) if static > 0 else None
        phases.append(row)
    steady = next((r for r in phases if r["phase"] == "steady"), None)
    diff = None
    if steady is not None and steady["static"]["multiplier"] > 0:
        diff = round(100.0 * (steady["fleet"]["multiplier"] / steady["static"]["multiplier"] - 1.0), 2)
    balanced = balanced_pairing(fleet)
    return {
        "scenario": scn.name,
        "rate_per_region_rps": rate,
        "attainment": scn.search.attainment,
        "phases": phases,
        "probe_s": duration_s or scn.search.duration_seconds,
        "precision": precision or scn.search.relative_precision,
        "balanced_pairing": balanced,
        "steady_diff_pct": diff,
        "steady_costs_nothing": None if diff is None or not balanced else diff >= 100.0 * (STEADY_FLOOR - 1.0) - 1e-9,
        "site_caps_gbps": site_caps,
        "over_cap": over,
    }


def render_table(rep: dict[str, Any]) -> str:
    """The report as text: goodput per phase (multipliers of the per-region rate), ratio, peaks against caps."""
    rate = rep["rate_per_region_rps"]
    lines = [
        f"{rep['scenario']}: goodput = the highest common multiplier of {rate} req/s per region at which every region "
        f"meets the TTFT objective for {rep['attainment']:.0%} of its requests",
        f"{'phase':<10} {'fleet x':>8} {'static x':>9} {'ratio':>6}   remote prefills by site (fleet / static)",
    ]
    for r in rep["phases"]:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        lines.append(
            f"{r['phase']:<10} {r['fleet']['multiplier']:>8.3f} {r['static']['multiplier']:>9.3f} {ratio:>6}   "
            f"{r['fleet']['remote_by_site']} / {r['static']['remote_by_site']}"
        )
    if rep["steady_diff_pct"] is not None:
        if rep["balanced_pairing"]:
            floor = 100.0 * (STEADY_FLOOR - 1.0)
            verdict = "costs nothing" if rep["steady_costs_nothing"] else "COSTS goodput"
            why = f"balanced static pairing: fleet routing {verdict} (floor {floor:+.0f} %)"
            if rep["probe_s"] < 300 or rep["precision"] > 0.02:  # measured: +-10 % from one burst either way
                why += f"; {rep['probe_s']:g}-s probes, {rep['precision']:.0%} bisection: judge on the full search"
        else:
            why = "unbalanced static pairing: fleet routing moves load off the loaded site"
        lines.append(f"steady state: fleet vs static {rep['steady_diff_pct']:+.2f} % ({why})")
    lines.append("largest 1-s-window egress over every probe, fleet routing, Gbps (cap):")
    for r in rep["phases"]:
        f = r["fleet"]
        links = ", ".join(f"{k} {v:.1f} ({r['link_cap_gbps'][k]:.0f})" for k, v in f["link_peak_gbps"].items())
        sites = ", ".join(f"{k} {v:.1f} ({rep['site_caps_gbps'][k]})" for k, v in f["site_peak_gbps"].items())
        lines.append(f"  {r['phase']}: links {links}; sites {sites}")
    lines.append(
        "every link and site within its cap (both modes)"
        if not rep["over_cap"]
        else "OVER CAP: " + "; ".join(rep["over_cap"])
    )
    return "\n".join(lines)
