"""Render the Grafana dashboard (dashboards/prfaas.json) to a PNG from REAL series: start the real router,
gateway, engines, link emulator and operator (tests/integration/observability_stack.py), drive traffic in
phases (short prompts, then long ones that go remote, then a prefill-queue surge that makes the operator flip
an instance), scrape them with a real Prometheus, run every panel's expressions as range queries and draw the
panels with matplotlib in the dashboard's layout. Grafana cannot run here; the queries are the dashboard's own.

Usage: .venv/bin/python scripts/render_dashboard.py [--out docs/dashboard.png] [--seconds 150]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "integration")]

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from observability_stack import ObservedStack, start  # noqa: E402
from testbed_support import processes  # noqa: E402

from prfaas_testbed.operator_harness import Harness  # noqa: E402

GRID_UNIT_W, GRID_UNIT_H = 0.62, 0.36  # inches per Grafana grid unit


def legend(fmt: str, labels: dict[str, str]) -> str:
    out = fmt
    for key in set(__import__("re").findall(r"\{\{(\w+)\}\}", fmt)):
        out = out.replace("{{" + key + "}}", labels.get(key, ""))
    return " ".join(out.split()) or "value"


def drive_phases(obs: ObservedStack, seconds: float) -> None:
    """Traffic in three phases over ``seconds`` of wall time."""
    third = seconds / 3
    phases = [(0.15, None), (0.6, None), (0.4, "prefill")]
    for share, surge in phases:
        if surge:
            obs.harness.prom.exporter.set_queue(obs.namespace, "pd-h20", surge, 40)
        end = time.monotonic() + third
        while time.monotonic() < end:
            obs.drive(8, long_share=share, concurrency=4)


def render(doc: dict[str, Any], obs: ObservedStack, start_s: float, end_s: float, out: Path) -> int:
    panels = [p for p in doc["panels"] if p["type"] != "row"]
    rows = sorted({p["gridPos"]["y"] for p in panels})
    fig_w = 24 * GRID_UNIT_W
    fig_h = len(rows) * 8 * GRID_UNIT_H * 0.6 + 1.0
    fig = plt.figure(figsize=(fig_w, fig_h), facecolor="#111217")
    step = max(1.0, (end_s - start_s) / 240)
    drawn = 0
    for panel in panels:
        g = panel["gridPos"]
        row = rows.index(g["y"])
        left = g["x"] / 24 + 0.035
        width = g["w"] / 24 - 0.05
        height = (1 - 0.04) / len(rows)
        top = 1 - 0.03 - row * height
        ax = fig.add_axes((left, top - height * 0.8, width, height * 0.68), facecolor="#181b1f")
        ax.set_title(panel["title"], color="#d8d9da", fontsize=10, loc="left")
        ax.tick_params(colors="#8e8e8e", labelsize=7)
        for spine in ax.spines.values():
            spine.set_color("#2c3235")
        ax.grid(color="#2c3235", linewidth=0.5)
        series = 0
        for target in panel["targets"]:
            for result in obs.query_range(target["expr"], start_s, end_s, step):
                xs = [float(t) - start_s for t, _ in result["values"]]
                ys = [float(v) for _, v in result["values"]]
                ys = [y if math.isfinite(y) else float("nan") for y in ys]
                label = legend(target["legendFormat"], result["metric"])
                ax.plot(xs, ys, linewidth=1.2, label=label[:40])
                series += 1
        if series:
            ax.legend(fontsize=6, loc="upper left", facecolor="#181b1f", labelcolor="#d8d9da", framealpha=0.6)
            drawn += 1
        else:
            ax.text(0.5, 0.5, "No data", color="#8e8e8e", ha="center", va="center", transform=ax.transAxes)
        unit = panel["fieldConfig"]["defaults"].get("unit", "")
        ax.set_xlabel(f"seconds since start   [{unit}]", color="#8e8e8e", fontsize=7)
    fig.suptitle(
        f"{doc['title']} — rendered from live series (real router, gateway, engines, link, operator)",
        color="#d8d9da",
        fontsize=13,
        x=0.01,
        ha="left",
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80, facecolor=fig.get_facecolor())
    plt.close(fig)
    return drawn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "dashboard.png")
    parser.add_argument("--seconds", type=float, default=150.0, help="wall seconds of traffic")
    args = parser.parse_args(argv)
    doc = json.loads((REPO / "dashboards" / "prfaas.json").read_text())
    tmp = Path(tempfile.mkdtemp(prefix="prfaas-render-"))
    harness = Harness(tmp)
    try:
        with processes(tmp) as procs:
            obs = start(procs, harness, tmp)
            try:
                start_s = time.time()
                drive_phases(obs, args.seconds)
                time.sleep(3)  # the last scrapes after the traffic (Prometheus scrapes every second)
                drawn = render(doc, obs, start_s, time.time(), args.out)
            finally:
                obs.stop()
    finally:
        harness.close()
    total = sum(1 for p in doc["panels"] if p["type"] != "row")
    print(f"wrote {args.out} ({drawn} of {total} panels with data)")
    return 0 if drawn == total else 1


if __name__ == "__main__":
    sys.exit(main())
