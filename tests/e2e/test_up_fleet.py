"""End to end: ``prfaas up --fleet`` as a user runs it (issue 50) — a real process that starts the live fleet (2 PrFaaS
sites, 2 PD regions, 4 links, emulated engines), drives it through its phases (steady; east's link to site-1 cut;
site-2's cap squeezed; site-2 drained) and writes ``summary.json``. Conditions from the run's own summary, no timing
thresholds: the delay from the cut to east's first prefill at site-2 is printed, in model seconds.
(tests/integration/test_fleet_live.py drives the same fleet through ``FleetStack`` directly; this one covers the CLI's
phase driver, ``prfaas_local.fleet_up``.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# the phases are model time at 50x and each lasts a fixed model time: with another test's engines starting beside
# it, stolen CPU becomes model latency (scripts/test.sh runs the solo tests after the parallel run, one at a time)
pytestmark = pytest.mark.solo

PHASE_S = 150  # model seconds per phase: 3 wall seconds at the fleet's 50x clock


@pytest.mark.timeout(300)
def test_prfaas_up_fleet_moves_the_cut_region_holds_the_caps_and_loses_nothing(tmp_path: Path) -> None:
    work = tmp_path / "fleet"
    argv = [sys.executable, "-m", "prfaas_cli.main", "up", "--fleet", "--duration", str(PHASE_S)]
    argv += ["--prometheus", "off", "--work-dir", str(work), "-o", "json"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=280, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, f"exit {result.returncode}\nstderr:\n{result.stderr[-3000:]}"
    printed: dict[str, Any] = json.loads(result.stdout)
    s: dict[str, Any] = json.loads((work / "summary.json").read_text())
    assert printed == s
    phases = {p["phase"]: p for p in s["phases"]}
    assert list(phases) == ["steady", "cut", "squeeze", "drain"]

    # every request answered, in every phase (a call cut mid-way fell back to the local prefill)
    # (the total counts what the clients finished after the last phase's reading as well)
    assert s["lost"] == 0 and s["requests"] >= sum(p["requests"] for p in s["phases"]) > 0
    for p in s["phases"]:
        assert p["requests"] > 0 and p["answered"] == p["requests"], p

    # steady: both regions prefer site-1 (its links first): east's remote prefills go there
    steady = phases["steady"]["served_gbit"]
    assert steady["east-to-site-1"] > 0, steady

    # the cut moved east's remote prefills to site-2: the driver saw site-2 serve east after it; from the next
    # phase on nothing goes over the cut link, while west keeps site-1
    assert s["cut_to_move_model_s"] is not None and s["cut_to_move_model_s"] >= 0
    assert phases["cut"]["served_gbit"]["east-to-site-2"] > 0
    for name in ("squeeze", "drain"):
        assert phases[name]["served_gbit"]["east-to-site-1"] == 0.0, (name, phases[name]["served_gbit"])
    assert phases["squeeze"]["served_gbit"]["west-to-site-1"] + phases["drain"]["served_gbit"]["west-to-site-1"] > 0
    assert phases["squeeze"]["served_gbit"]["east-to-site-2"] > 0  # east at site-2 until it is drained

    # the drained site takes no new work (once what it held has finished: its engines idle)
    assert s["drain_settled"] is True
    drained = {k: v for k, v in phases["drain"]["served_gbit"].items() if k.endswith("-to-site-2")}
    assert drained and all(v == 0.0 for v in drained.values()), drained

    # every site's busiest settled 1-s window, by its relays' own counters, within its cap (the squeezed one after
    # the squeeze) plus the shaper's burst
    burst = s["burst_gbit"]
    assert phases["squeeze"]["site_cap_gbps"]["site-2"] < s["site_cap_gbps"]
    for p in s["phases"]:
        for site, busiest in p["busiest_gbps"].items():
            assert busiest <= p["site_cap_gbps"][site] + burst + 1e-9, (p["phase"], site, busiest)
    assert phases["squeeze"]["busiest_gbps"]["site-2"] > 0  # the squeezed site was carrying KV
    print(f"prfaas up --fleet: east's remote prefills at site-2 {s['cut_to_move_model_s']} model s after the cut")
