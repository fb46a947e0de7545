"""The tight-link scenario: the link calendar (prfaas_pd) against a bandwidth-oblivious PD router, through
`prfaas simulate ... -o json` as a user runs it, and the calendar's egress per 1-s window against the cap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prfaas_cli.main import main
from prfaas_cli.simulate_cmd import load_scenario
from prfaas_core.sim.search import prepare, run_config

EX = Path(__file__).resolve().parents[2] / "examples" / "02-simulate" / "tight-link.yaml"


def test_prfaas_pd_beats_the_oblivious_baseline_under_the_cap(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(EX), "--output", "json", "--jobs", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    ours, base = out["prfaas_pd"], out["oblivious_pd"]
    assert ours["goodput_rps"] >= base["goodput_rps"]
    assert ours["egress_peak_gbps"] <= out["link_cap_gbps"] + 1e-6
    assert base["egress_peak_gbps"] > out["link_cap_gbps"]  # the baseline passes the cap
    assert ours["link_waits"]["waited"] > 0 and ours["link_waits"]["wait_mean_s"] > 0
    assert base["link_waits"] is None


def test_every_window_holds_the_cap_in_force() -> None:
    sc, _ = load_scenario(str(EX))
    prepared = prepare(sc)
    cut = sc.link.schedule[0]
    result, _, requests = run_config(prepared, prepared.planned.configs["prfaas_pd"], 1.0, sc.duration_seconds)
    assert result.completed == len(requests)
    s = result.series
    mu = sc.link.max_utilization
    for t, egress in zip(s.time_s, s.egress_gbps, strict=True):
        if t <= cut.at_seconds:
            assert egress <= sc.link.capacity_gbps * mu + 1e-6, t
        elif t > cut.at_seconds + 10.0:  # bookings made before the cut have drained
            assert egress <= cut.capacity_gbps * mu + 1e-6, t
    assert result.link_waits > 0


def _run(replicas: int, windows: bool) -> tuple[float, float]:
    """(max egress above the cap in force outside the cut's drain, SLO attainment) for prfaas_pd."""
    sc, _ = load_scenario(str(EX))
    sc = sc.model_copy(
        update={"policy": sc.policy.model_copy(update={"router_replicas": replicas, "link_windows": windows})}
    )
    prepared = prepare(sc)
    result, summary, _ = run_config(prepared, prepared.planned.configs["prfaas_pd"], 1.0, sc.duration_seconds)
    s, cut = result.series, sc.link.schedule[0].at_seconds
    over = max(
        e - c * sc.link.max_utilization
        for t, e, c in zip(s.time_s, s.egress_gbps, s.capacity_gbps, strict=True)
        if not cut <= t <= cut + 10.0
    )
    return over, summary.slo_attainment


def test_three_router_replicas_pass_the_cap_without_the_calendar_and_hold_it_with_it() -> None:
    over_own, _ = _run(3, windows=False)  # each replica admits against its own streams only
    assert over_own > 0.1
    over_cal, slo_cal = _run(3, windows=True)  # the gateway's calendar sees every replica's streams
    assert over_cal <= 1e-6
    _, slo_one = _run(1, windows=True)
    # the calendar's cap is exact whatever the number of routers (above); the attainment is too, within a request or
    # two of the ~1,400: with the lanes earliest due first (laneOrder: deadline) one more request waited for a window
    # with 3 replicas than with 1 (294 vs 293; in arrival order the two runs were identical); deterministic (seeded)
    assert slo_cal == pytest.approx(slo_one, abs=0.002)
