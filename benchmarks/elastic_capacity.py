"""Elastic capacity against the best static deployment on the diurnal scenario (issue 47's figure).

Runs ``prfaas simulate --elastic``'s comparison (:mod:`prfaas_core.sim.elastic_run`): the planner sizes the static
deployment for the peak (the cheapest PrFaaS + PD for each 10-minute window's rate and mix, elementwise max), the
simulator runs it and its ±1 neighbourhood day-long, and the same deployment with both clusters elastic (the
operator's decision, ``prfaas_core.policy.elastic``, every 30 s; 120 s start-up; drain-first scale-in). Prints the
table and the ratios, writes ``elastic.json`` and ``elastic-capacity.png`` (instances against demand) to ``--out``.

    .venv/bin/python benchmarks/elastic_capacity.py [--scenario examples/02-simulate/diurnal.yaml] [--out DIR]
    .venv/bin/python benchmarks/elastic_capacity.py --smoke     # 15 simulated minutes, the peak size only
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

from prfaas_cli.simulate_elastic import render_plot, render_table, report
from prfaas_core.sim.elastic_run import compare
from prfaas_core.sim.scenario import Scenario
from prfaas_core.sim.search import prepare

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default=str(REPO / "examples/02-simulate/diurnal.yaml"))
    ap.add_argument("--out", default=str(REPO / "out/elastic"), help="where elastic.json and the PNG go")
    ap.add_argument("--smoke", action="store_true", help="15 simulated minutes; the planner's peak size only")
    args = ap.parse_args()
    scenario = Scenario.model_validate(yaml.safe_load(Path(args.scenario).read_text(encoding="utf-8")))
    if args.smoke:
        scenario = scenario.model_copy(update={"duration_seconds": 900.0})
    started = time.monotonic()
    prepared = prepare(scenario, None)
    candidates = None
    if args.smoke:
        from prfaas_core.sim.elastic_run import peak_sizes, prices

        candidates = [peak_sizes(prepared, prices=prices(scenario.elastic))]
    peak, statics, elastic = compare(
        prepared, candidates=candidates, progress=lambda what: print(f"... {what}", file=sys.stderr, flush=True)
    )
    rep = report(prepared, peak, statics, elastic)
    rep["wall_s"] = round(time.monotonic() - started, 1)
    print(render_table(rep))
    print(f"wall {rep['wall_s']} s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "elastic.json").write_text(json.dumps(rep, indent=2) + "\n", encoding="utf-8")
    title = f"Elastic capacity on {scenario.name}: instances against demand"
    (out / "elastic-capacity.png").write_bytes(render_plot(elastic, title))
    print(f"wrote {out / 'elastic.json'} and {out / 'elastic-capacity.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
