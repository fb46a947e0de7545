"""A fleet's remote choice against static pairing (issue 50's figure).

Runs two scenarios, each phase with the fleet's routing (:func:`prfaas_core.policy.fleet.choose_site` on every site
a region reaches, the gateway's admission booking the link and the site egress cap together) and with static
pairing, at the same TTFT SLO. Goodput = the highest common rate multiplier at which every region meets the
objective (:func:`prfaas_core.sim.fleet.goodput`).

* ``examples/02-simulate/fleet.yaml``: 2 PrFaaS sites of 4 x H200, 3 PD regions of 8 x H20, 6 links of 100 Gbps
  at cap 0.8; steady, one link squeezed to 5 Gbps, that link cut, one site lost; static pairing regions 1-2 on
  site 1, region 3 on site 2 (unbalanced: fleet routing gains even in the steady state).
* ``examples/02-simulate/fleet-balanced.yaml``: the same sites and regions' hardware, load and caps, 2 regions, one
  per site (balanced: nothing to move; fleet routing must cost nothing, at least 98 % of static pairing's steady
  goodput, :data:`prfaas_core.sim.fleet_report.STEADY_FLOOR`).

Prints per scenario the table (goodput per phase, fleet / static, the steady difference) and the largest
1-s-window egress of every link and site over every probe against its cap, then fleet / static per case; writes
``<scenario>.json`` per scenario (``fleet.json``, ``fleet-balanced.json``) and ``fleet-routing.png`` (every case)
to ``--out``. The simulator is deterministic: the same seeds give the same figures.

    .venv/bin/python benchmarks/fleet_routing.py [--scenario FILE ...] [--out DIR]
    .venv/bin/python benchmarks/fleet_routing.py --smoke   # 60-s probes, coarse bisection; balanced: 300-s, 2 %
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import yaml

from prfaas_cli.simulate_fleet import render_plot
from prfaas_core.sim.fleet_config import FleetScenario
from prfaas_core.sim.fleet_report import balanced_pairing, measure, render_table

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = [REPO / "examples/02-simulate/fleet.yaml", REPO / "examples/02-simulate/fleet-balanced.yaml"]


def smoke_search(scn: FleetScenario) -> tuple[float, float | None]:
    """Smoke probes: 60 s and a coarse bisection; a balanced pairing's (whose steady check is 2 %) 300 s at the
    scenario's precision (shorter probes measure bursts more than routing)."""
    return (300.0, None) if balanced_pairing(scn.fleet) else (60.0, 0.25)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", action="append", help="a fleet scenario (repeatable; default: both examples)")
    ap.add_argument("--out", default=str(REPO / "out/fleet"), help="where the JSON files and the PNG go")
    ap.add_argument("--smoke", action="store_true", help="short probes, coarse bisection")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    reports: list[dict[str, Any]] = []
    for path in args.scenario or [str(p) for p in SCENARIOS]:
        scn = FleetScenario.model_validate(yaml.safe_load(Path(path).read_text(encoding="utf-8")))
        started = time.monotonic()
        rep = measure(scn, *(smoke_search(scn) if args.smoke else (None, None)))
        rep["wall_s"] = round(time.monotonic() - started, 1)
        print(render_table(rep))
        print(f"wall {rep['wall_s']} s\n")
        (out / f"{scn.name}.json").write_text(json.dumps(rep, indent=2) + "\n", encoding="utf-8")
        reports.append(rep)
    print("fleet / static goodput per case:")
    for rep in reports:
        pairing = "balanced" if rep["balanced_pairing"] else "unbalanced"
        for r in rep["phases"]:
            ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
            print(f"  {rep['scenario']:<16} {r['phase']:<10} {pairing + ' pairing':<20} {ratio}")
    combined = {
        "scenario": " + ".join(r["scenario"] for r in reports),
        "phases": [
            dict(p, phase=p["phase"] if i == 0 else f"{p['phase']}\n({rep['scenario']})")
            for i, rep in enumerate(reports)
            for p in rep["phases"]
        ],
    }
    (out / "fleet-routing.png").write_bytes(render_plot(combined))
    print(f"wrote {', '.join(str(out / (r['scenario'] + '.json')) for r in reports)} and {out / 'fleet-routing.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
