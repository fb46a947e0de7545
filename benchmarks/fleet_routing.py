"""A fleet's remote choice against static pairing (issue 50's figure).

Runs ``examples/02-simulate/fleet.yaml`` (2 PrFaaS sites of 4 x H200, 3 PD regions of 8 x H20, 6 links of
100 Gbps at cap 0.8) in each phase (steady; one link squeezed to 5 Gbps; that link cut; one site lost) with the
fleet's routing (:func:`prfaas_core.policy.fleet.choose_site` on every site a region reaches, the gateway's
admission booking the link and the site egress cap together) and with static pairing (regions 1-2 bound to site 1,
region 3 to site 2), at the same TTFT SLO. Goodput = the highest common rate multiplier at which every region meets
the objective (:func:`prfaas_core.sim.fleet.goodput`). Prints the table (goodput per phase, the ratio, the steady
difference) and the largest 1-s-window egress of every link and site over every probe against its cap; writes
``fleet.json`` and ``fleet-routing.png`` to ``--out``.

    .venv/bin/python benchmarks/fleet_routing.py [--scenario examples/02-simulate/fleet.yaml] [--out DIR]
    .venv/bin/python benchmarks/fleet_routing.py --smoke       # 60-s probes, coarse bisection (seconds)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import yaml

from prfaas_core.sim.fleet import FLEET_MODES, Goodput, goodput
from prfaas_core.sim.fleet_config import FleetScenario
from prfaas_local.plots import figure, png

REPO = Path(__file__).resolve().parents[1]


def measure(scn: FleetScenario, duration_s: float | None, precision: float | None) -> dict[str, Any]:
    rate = scn.fleet.rate_per_second
    phases: list[dict[str, Any]] = []
    for phase in scn.fleet.phases:
        row: dict[str, Any] = {"phase": phase.name}
        for mode in FLEET_MODES:
            g: Goodput = goodput(scn, phase, mode, duration_s, precision)
            best = g.best
            row[mode] = {
                "multiplier": round(g.multiplier, 4),
                "per_region_rps": round(g.multiplier * rate, 4),
                "probes": g.probes,
                "remote_by_site": dict(best.remote) if best else {},
                "link_peak_gbps": {k: round(v, 3) for k, v in g.link_peaks.items()},
                "site_peak_gbps": {k: round(v, 3) for k, v in g.site_peaks.items()},
                "link_cap_gbps": dict(best.link_caps) if best else {},
                "site_cap_gbps": {k: v for k, v in (best.site_caps if best else {}).items()},
            }
        s = row["static"]["multiplier"]
        row["ratio"] = round(row["fleet"]["multiplier"] / s, 3) if s > 0 else None
        phases.append(row)
    caps = {ln.name: ln.capacity_gbps * ln.max_utilization for ln in scn.fleet.links}
    site_caps = {s.name: s.site_egress_cap_gbps for s in scn.fleet.sites}
    over: list[str] = []
    for row in phases:
        changes = next(p for p in scn.fleet.phases if p.name == row["phase"]).links
        for mode in FLEET_MODES:
            for name, peak in row[mode]["link_peak_gbps"].items():
                cap = caps[name]
                if name in changes and changes[name].capacity_gbps is not None:
                    cap = changes[name].capacity_gbps * next(x for x in scn.fleet.links if x.name == name).max_utilization
                if peak > cap + 1e-6:
                    over.append(f"{row['phase']}/{mode} link {name}: {peak:.3f} > {cap:.3f}")
            for name, peak in row[mode]["site_peak_gbps"].items():
                cap_s = site_caps[name]
                if cap_s is not None and peak > cap_s + 1e-6:
                    over.append(f"{row['phase']}/{mode} site {name}: {peak:.3f} > {cap_s:.3f}")
    steady = next((r for r in phases if r["phase"] == "steady"), None)
    diff = None
    if steady and steady["static"]["multiplier"] > 0:
        diff = round(100.0 * (steady["fleet"]["multiplier"] / steady["static"]["multiplier"] - 1.0), 2)
    return {"scenario": scn.name, "rate_per_region_rps": rate, "phases": phases, "steady_diff_pct": diff,
            "over_cap": over, "link_caps_gbps": caps, "site_caps_gbps": site_caps}


def table(rep: dict[str, Any]) -> str:
    lines = [f"{'phase':<10} {'fleet x':>8} {'static x':>9} {'ratio':>6}   fleet remote by site / static"]
    for r in rep["phases"]:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        lines.append(
            f"{r['phase']:<10} {r['fleet']['multiplier']:>8.3f} {r['static']['multiplier']:>9.3f} {ratio:>6}   "
            f"{r['fleet']['remote_by_site']} / {r['static']['remote_by_site']}"
        )
    lines.append(f"steady state: fleet vs static {rep['steady_diff_pct']:+.2f} %")
    lines.append("largest 1-s-window egress over every probe, Gbps (cap):")
    for r in rep["phases"]:
        f = r["fleet"]
        links = ", ".join(f"{k} {v:.1f}" for k, v in f["link_peak_gbps"].items())
        sites = ", ".join(f"{k} {v:.1f} ({rep['site_caps_gbps'][k]})" for k, v in f["site_peak_gbps"].items())
        lines.append(f"  {r['phase']:<10} fleet links: {links}; sites: {sites}")
    lines.append("every link and site within its cap" if not rep["over_cap"] else "OVER CAP: " + "; ".join(rep["over_cap"]))
    return "\n".join(lines)


def plot(rep: dict[str, Any]) -> bytes:
    fig = figure(9, 4)
    ax = fig.subplots(1, 1)
    names = [r["phase"] for r in rep["phases"]]
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [r["fleet"]["per_region_rps"] for r in rep["phases"]], 0.4, label="fleet routing")
    ax.bar([x + 0.2 for x in xs], [r["static"]["per_region_rps"] for r in rep["phases"]], 0.4, label="static pairing")
    ax.set_xticks(list(xs), names)
    ax.set(ylabel="goodput per region (req/s)", title=f"{rep['scenario']}: fleet routing vs static pairing")
    ax.grid(True, axis="y", lw=0.3)
    ax.legend(fontsize=8)
    return png(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default=str(REPO / "examples/02-simulate/fleet.yaml"))
    ap.add_argument("--out", default=str(REPO / "out/fleet"), help="where fleet.json and the PNG go")
    ap.add_argument("--smoke", action="store_true", help="60-s probes, coarse bisection")
    args = ap.parse_args()
    scn = FleetScenario.model_validate(yaml.safe_load(Path(args.scenario).read_text(encoding="utf-8")))
    started = time.monotonic()
    rep = measure(scn, 60.0 if args.smoke else None, 0.25 if args.smoke else None)
    rep["wall_s"] = round(time.monotonic() - started, 1)
    print(table(rep))
    print(f"wall {rep['wall_s']} s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fleet.json").write_text(json.dumps(rep, indent=2) + "\n", encoding="utf-8")
    (out / "fleet-routing.png").write_bytes(plot(rep))
    print(f"wrote {out / 'fleet.json'} and {out / 'fleet-routing.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
