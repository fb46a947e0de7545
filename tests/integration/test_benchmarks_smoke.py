"""Every script in benchmarks/ runs its real code path on a tiny input (its smoke mode), so that none rots.

The figures mean nothing here; what is checked is that each script runs to its end and prints what it
reports. ``real_engines.py`` needs the real-engine tier's vLLM environment and is covered by that tier.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"


def run(script: str, *args: str, timeout: float = 240.0) -> str:
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def test_every_benchmark_has_a_smoke_test() -> None:
    covered = {
        "elastic_capacity",
        "fleet_routing",
        "goodput_vs_peers",
        "operator_scale",
        "parity",
        "router_decision",
        "router_overhead",
        "sim_speed",
        "soak_floods",
        "testbed",
    }
    scripts = {p.stem for p in BENCH.glob("*.py")} - {"real_engines"}
    assert scripts <= covered, f"benchmarks without a smoke test: {sorted(scripts - covered)}"


def test_sim_speed() -> None:
    out = run("sim_speed.py", "--smoke")
    assert "production policies" in out and "fixed-t baseline" in out


def test_elastic_capacity(tmp_path: Path) -> None:
    out = run("elastic_capacity.py", "--smoke", "--out", str(tmp_path))
    assert "elastic / best static" in out or "no static run met the objective" in out
    rep = json.loads((tmp_path / "elastic.json").read_text())
    assert rep["elastic"]["completed"] == rep["elastic"]["arrived"] > 0
    assert rep["elastic"]["gpu_hours"] > 0 and rep["static"]
    # where the elastic instances go: per window, each cluster's desired, ready and demand; the demand's envelope
    assert rep["per_window"] and {"desired", "ready", "demand"} <= set(rep["per_window"][0]["pd"])
    assert 0 < rep["demand_envelope_gpu_hours"] <= rep["demand_envelope_whole_instances_gpu_hours"]
    assert (tmp_path / "elastic-capacity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fleet_routing(tmp_path: Path) -> None:
    out = run("fleet_routing.py", "--smoke", "--out", str(tmp_path))
    assert "every link and site within its cap" in out
    rep = json.loads((tmp_path / "fleet.json").read_text())
    assert [r["phase"] for r in rep["phases"]] == ["steady", "squeeze", "cut", "site-lost"]
    cut = next(r for r in rep["phases"] if r["phase"] == "cut")
    assert cut["fleet"]["multiplier"] > cut["static"]["multiplier"] > 0
    assert rep["balanced_pairing"] is False  # two regions on site 1: fleet routing may gain in the steady state too
    # a balanced static pairing (one region per site): nothing to move, fleet routing costs at most 2 % of goodput
    # (the simulator is deterministic under the scenario's seed: a behaviour, not a timing)
    bal = json.loads((tmp_path / "fleet-balanced.json").read_text())
    assert bal["balanced_pairing"] is True and [r["phase"] for r in bal["phases"]] == ["steady"]
    steady = bal["phases"][0]
    assert steady["static"]["multiplier"] > 0 and steady["fleet"]["multiplier"] >= 0.98 * steady["static"]["multiplier"]
    assert bal["steady_costs_nothing"] is True and bal["over_cap"] == []
    assert "fleet-balanced   steady     balanced pairing" in out
    assert (tmp_path / "fleet-routing.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_router_decision() -> None:
    out = json.loads(run("router_decision.py", "--smoke"))
    assert out["policy_call_us"]["p50"] > 0
    long_case = out["decision_incl_prefix_lookups_27k_tokens_us"]
    assert len(long_case["p99_runs"]) == 2 and long_case["p99"] in long_case["p99_runs"]
    assert out["decode_holdings_learn_27k_tokens_at_capacity_ms"]["p50"] > 0
    costs = out["tokenize"]
    assert set(costs) == {"chars4", "bpe-32000"}
    for figures in costs.values():
        assert 0 < figures["1k_tokens_ms"]["p50"] <= figures["32k_tokens_ms"]["p50"]


def test_testbed() -> None:
    out = json.loads(run("testbed.py", "--smoke", "--json"))
    assert out["engine_rps"] > 0 and out["relay_MBps"] > 0


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (scripts/system-deps.sh)")
def test_soak_floods(tmp_path: Path) -> None:
    out = json.loads(run("soak_floods.py", "--smoke", "--out", str(tmp_path / "soak.json")))
    assert [r["flood"] for r in out["floods"]] == [0, 1, 2]
    assert all(r["router_mb"] > 0 and r["gateway_mb"] > 0 for r in out["floods"])
    assert sum(out["floods"][1]["statuses"].values()) == 6


@pytest.mark.slow
def test_soak_floods_full(tmp_path: Path) -> None:
    """The full soak (issue 39): five floods of 200 x 32K-token requests; the figures go to docs/benchmarks.md."""
    out = json.loads(run("soak_floods.py", "--out", str(tmp_path / "soak.json"), timeout=3600.0))
    assert len(out["floods"]) == 6


def test_router_overhead(tmp_path: Path) -> None:
    out = json.loads(run("router_overhead.py", "--smoke", "--workers", "2", "--out", str(tmp_path / "overhead.json")))
    assert out["max_rps"]["prfaas_router"] > 0 and out["max_rps"]["prfaas_router_1_worker"] > 0
    assert out["ours_plain_proxy_path"]["backend_requests_per_client_request"] > 0.9  # two workers, one leg each


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus is not installed (scripts/system-deps.sh)")
@pytest.mark.timeout(660)
def test_operator_scale(tmp_path: Path) -> None:
    # its deadlines bound a hang: the harness starts four processes before the operator (slow on a loaded machine)
    run("operator_scale.py", "--smoke", "--out", str(tmp_path / "scale.json"), timeout=600.0)
    out = json.loads((tmp_path / "scale.json").read_text())
    assert out["results"][0]["cycles"]


def test_goodput_vs_peers(tmp_path: Path) -> None:
    out = json.loads(run("goodput_vs_peers.py", "--smoke", "--out", str(tmp_path / "goodput.json")))
    for system in ("prfaas_pd", "prfaas_pd_3r2g", "all_local"):
        assert out["systems"][system]["reference"]["requests"] == 6, system
    # the three router replicas and their two gateways counted every request (a decision each)
    counted = out["systems"]["prfaas_pd_3r2g"]["reference"]["router_counted"]
    decisions = sum(v for k, v in counted.items() if k.startswith("prfaas_router_route_decisions_total"))
    assert decisions >= 6, counted
    # and shared their PD prefill books, authenticated by their token
    assert counted.get("prfaas_router_replica_sync_total{result=sent}", 0) > 0, counted
    assert "prfaas_router_replica_sync_total{result=unauthorized}" not in counted, counted


def test_parity(tmp_path: Path) -> None:
    """The emulated side of the parity scenario gives the figures real vLLM gave (routes, KV blocks the router
    accounted and the decode pulled, prompt tokens by source, prefix hits): the script exits 1 on a difference."""
    run("parity.py", "--smoke", "--out", str(tmp_path / "parity.json"))
    out = json.loads((tmp_path / "parity.json").read_text())
    assert out["differ"] == []
    assert out["totals"]["emulated"]["routes"] == {"remote": 6, "local": 4}
    assert out["totals"]["emulated"]["decode_cache_hit_tokens"] > 0  # the sessions' decode-side prefix hits
    for row in out["emulated"]:  # the router books the KV the decode pulls, not what the decode already holds
        if row["route"] == "remote":
            assert row["router_kv_blocks"] == row["pulled_blocks"], row
