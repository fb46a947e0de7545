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
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "integration")]

from observability_stack import RATE_INTERVAL, ObservedStack, start  # noqa: E402
from testbed_support import processes  # noqa: E402

from prfaas_local import dashboard_png  # noqa: E402
from prfaas_testbed.operator_harness import Harness  # noqa: E402


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
    """Every panel from the stack's Prometheus (prfaas_local.dashboard_png draws them); the panels with data."""
    data, drawn = dashboard_png.render(
        doc,
        lambda expr, a, b, step: obs.query_range(expr, a, b, step),
        start_s,
        end_s,
        "rendered from live series (real router, gateway, engines, link, operator)",
        rate_interval=RATE_INTERVAL,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
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
