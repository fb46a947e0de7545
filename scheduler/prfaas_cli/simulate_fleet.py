"""``prfaas simulate`` on a fleet scenario (a ``fleet:`` block: several PrFaaS sites and PD regions, e.g.
``examples/02-simulate/fleet.yaml``): fleet routing against static pairing in every phase
(:mod:`prfaas_core.sim.fleet_report`); ``--quick``: 120-s probes and a coarser search; ``--plot-dir``:
``fleet-routing.png`` (goodput per phase)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prfaas_core.sim.fleet_config import FleetScenario
from prfaas_core.sim.fleet_report import measure, render_table
from prfaas_local.plots import PlotDirError, figure, png, write_plots

from .output import EXIT_OK, STRUCTURED, emit, fail


def render_plot(rep: dict[str, Any]) -> bytes:
    """Goodput per region (req/s) per phase, fleet routing beside static pairing."""
    fig = figure(9, 4)
    ax = fig.subplots(1, 1)
    rows = rep["phases"]
    xs = list(range(len(rows)))
    ax.bar([x - 0.2 for x in xs], [r["fleet"]["per_region_rps"] for r in rows], 0.4, label="fleet routing")
    ax.bar([x + 0.2 for x in xs], [r["static"]["per_region_rps"] for r in rows], 0.4, label="static pairing")
    ax.set_xticks(xs, [r["phase"] for r in rows])
    ax.set(ylabel="goodput per region (req/s)", title=f"{rep['scenario']}: fleet routing vs static pairing")
    ax.grid(True, axis="y", lw=0.3)
    ax.legend(fontsize=8)
    return png(fig)


def run_fleet_cli(scn: FleetScenario, output: str, plot_dir: Path | None, quick: bool) -> int:
    rep = measure(scn, 120.0 if quick else None, 0.1 if quick else None)
    if output in STRUCTURED:
        emit(rep, output)
    else:
        print(render_table(rep))
    if plot_dir is not None:
        try:
            write_plots(plot_dir, {"fleet-routing.png": render_plot(rep)})
        except PlotDirError as exc:
            return fail(exc)
    return EXIT_OK
