"""End to end: ``prfaas up`` with elastic capacity (issue 47) — demand doubles and falls back; the PrFaaS site
(region A's loop) and the PD cluster (region B's loop) scale out after the step and back in after the fall, every
request answered. Conditions from the run's own summary (the session goes on after the replay until both clusters
are back at their min), no timing thresholds: the delays are printed, in model seconds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.solo  # its engines' start-up and the loops' decisions are model time: run alone

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "examples" / "05-up" / "elastic.yaml"


@pytest.mark.timeout(300)
def test_both_clusters_scale_out_after_the_demand_step_and_in_after_it(tmp_path: Path) -> None:
    work, plots = tmp_path / "up", tmp_path / "plots"
    argv = [sys.executable, "-m", "prfaas_cli.main", "up", "--prfaas", "1", "--pd", "2", "--scenario", str(SCENARIO)]
    argv += ["--seed", "5", "--prometheus", "off", "--work-dir", str(work), "--plot-dir", str(plots), "-o", "json"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=280, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, f"exit {result.returncode}\nstderr:\n{result.stderr[-3000:]}"
    s: dict[str, Any] = json.loads(result.stdout)
    req = s["requests"]
    # the ledger: every request of the trace answered, none failed (engines were added and drained under it)
    assert req["requests"] >= 30 and req["ok"] == req["requests"], s["errors"]
    el = s["elastic"]
    assert el["demand_step_model_s"] == 20 and el["demand_fall_model_s"] == 70
    for name, start in (("prfaas", 1), ("pd", 2)):
        c = el["clusters"][name]
        assert c["start"] == start
        # after the step: asked for more, and the added engine served (ready as its region sees it)
        assert c["peak_desired"] > start and c["scale_out_asked_s"] is not None, (name, el["decisions"])
        assert c["peak_ready"] > start and c["scale_out_ready_s"] is not None, (name, el["timeline"][-20:])
        # after the fall: back at the start (drained, then stopped)
        assert c["end_desired"] == start and c["back_to_start_s"] is not None, (name, el["decisions"][-6:])
        outs = [d for d in el["decisions"] if d["cluster"] == name and d["direction"] == "out"]
        ins = [d for d in el["decisions"] if d["cluster"] == name and d["direction"] == "in"]
        assert outs and ins and "scale out: demand" in outs[0]["reason"] and "scale in" in ins[-1]["reason"]
    assert (plots / "up.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(
        "elastic delays (model s): "
        + "; ".join(
            f"{n}: out asked +{c['scale_out_asked_s']}, ready +{c['scale_out_ready_s']}; in +{c['scale_in_asked_s']}, "
            f"back +{c['back_to_start_s']}"
            for n, c in el["clusters"].items()
        )
    )
