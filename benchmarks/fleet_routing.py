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

import yaml

from prfaas_cli.simulate_fleet import render_plot
from prfaas_core.sim.fleet_config import FleetScenario
from prfaas_core.sim.fleet_report import measure, render_table

REPO = Path(__file__).resolve().parents[1]


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
    print(render_table(rep))
    print(f"wall {rep['wall_s']} s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fleet.json").write_text(json.dumps(rep, indent=2) + "\n", encoding="utf-8")
    (out / "fleet-routing.png").write_bytes(render_plot(rep))
    print(f"wrote {out / 'fleet.json'} and {out / 'fleet-routing.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
