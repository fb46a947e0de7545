"""`prfaas simulate` as a user runs it: JSON and table reports, plots, traces, determinism, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from prfaas_cli.main import main

REPO = Path(__file__).resolve().parents[2]
EX = REPO / "examples" / "02-simulate"
DEPLOYMENTS = ("homogeneous_pd", "naive_heterogeneous", "prfaas_pd_static", "prfaas_pd")
TINY = """
name: tiny
seed: 4
durationSeconds: 300
arrivals: {process: poisson, ratePerSecond: 1.8}
search: {durationSeconds: 300, relativePrecision: 0.1}
"""


def prfaas(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prfaas_cli.main", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
        check=False,
    )


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY, encoding="utf-8")
    return path


def test_json_report_with_searches_and_plots(tiny: Path, tmp_path: Path) -> None:
    plots = tmp_path / "plots"
    result = prfaas("simulate", str(tiny), "--output", "json", "--plot-dir", str(plots), "--jobs", "2")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)  # stdout holds only the JSON
    assert out["link_cap_gbps"] == pytest.approx(80.0)
    for name in DEPLOYMENTS:
        d = out[name]
        for key in ("throughput_rps", "goodput_rps", "ttft_p90_s", "egress_mean_gbps", "egress_peak_gbps"):
            assert isinstance(d[key], float), (name, key)
        assert d["egress_peak_gbps"] <= out["link_cap_gbps"]
        assert d["completed"] == d["requests"]
        assert d["goodput_rps"] <= 1.2 * d["throughput_rps"]
    assert out["homogeneous_pd"]["egress_peak_gbps"] == 0.0
    assert out["naive_heterogeneous"]["offload_fraction"] == 1.0
    assert 0 < out["prfaas_pd"]["offload_fraction"] < 1
    assert set(out["prfaas_pd"]["series"]) >= {"time_s", "egress_gbps", "threshold_tokens", "prefill", "decode"}
    assert "\r" not in result.stderr and "%" not in result.stderr  # no progress frames into a log (not a terminal)
    for name in ("ttft-cdf.png", "egress.png", "roles-threshold.png"):
        assert (plots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_elastic_against_the_best_static(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plots = tmp_path / "plots"
    path = tmp_path / "tiny-elastic.yaml"
    path.write_text(TINY + "elastic: {enabled: true, prfaasMaxInstances: 3, pdMaxInstances: 6}\n", encoding="utf-8")
    assert main(["simulate", str(path), "-o", "json", "--plot-dir", str(plots)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["planner_peak"]["prfaas_instances"] >= 1 and out["planner_peak"]["pd_instances"] >= 2
    el = out["elastic"]
    assert el["completed"] == el["arrived"] > 0
    assert 1 <= el["prfaas_instances"] <= 3 and 2 <= el["pd_instances"] <= 6
    best = out["best_static"]
    assert best is not None and best["slo_attainment"] >= out["objective_attainment"]
    assert out["gpu_hours_ratio"] == pytest.approx(el["gpu_hours"] / best["gpu_hours"], rel=0.02)
    assert (plots / "elastic-capacity.png").read_bytes()[:4] == b"\x89PNG"


def test_a_bad_elastic_block_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(TINY + "elastic: {prfaasMinInstances: 5, prfaasMaxInstances: 2}\n", encoding="utf-8")
    assert main(["simulate", str(path), "--elastic"]) == 1
    assert "prfaasMinInstances" in capsys.readouterr().err


def test_table_is_readable_and_runs_are_deterministic(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(tiny), "--no-search", "--jobs", "1"]) == 0
    first, err = capsys.readouterr()
    assert "\r" not in err  # captured stderr is no terminal: no progress frames in a log
    for label in ("Throughput (req/s)", "Goodput", "TTFT P90 / P99 (s)", "Egress mean / peak", "Role flips"):
        assert label in first
    assert all(name in first for name in DEPLOYMENTS)
    assert main(["simulate", str(tiny), "--no-search", "--jobs", "1"]) == 0
    assert capsys.readouterr().out == first
    assert main(["simulate", str(tiny), "--no-search", "--jobs", "1", "--seed", "5"]) == 0
    assert capsys.readouterr().out != first


def test_write_trace_then_replay_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    assert main(["simulate", str(EX / "agentic-sessions.yaml"), "--write-trace", str(trace)]) == 0
    lines = trace.read_text(encoding="utf-8").splitlines()
    assert len(lines) > 500 and json.loads(lines[0])["session_id"]
    scenario = tmp_path / "replay.yaml"
    scenario.write_text(
        "name: replay\ndurationSeconds: 600\narrivals: {process: trace, traceFile: t.jsonl}\n", encoding="utf-8"
    )
    capsys.readouterr()
    assert main(["simulate", str(scenario), "--no-search", "--output", "json", "--jobs", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prfaas_pd"]["requests"] == len(lines)
    assert out["prfaas_pd"]["prefix_hit_tokens"] > 0  # the sessions' prefixes hit the caches


def test_the_checked_in_trace_is_what_its_generator_writes(tmp_path: Path) -> None:
    trace = tmp_path / "again.jsonl"
    assert main(["simulate", str(EX / "agentic-sessions.yaml"), "--write-trace", str(trace)]) == 0
    assert trace.read_text(encoding="utf-8") == (EX / "agentic-trace.jsonl").read_text(encoding="utf-8")
    assert (EX / "agentic-trace.jsonl").stat().st_size < 200_000


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("arrivals: {ratePerSecond: -1}\n", "arrivals.ratePerSecond"),
        ("link: {capacityGbps: 100, scarceWatermark: 0.5, abundantWatermark: 0.6}\n", "link.abundantWatermark"),
        ("deployments: [prfaas_pd, fastest]\n", "deployments.1"),
        ("arrivals: {process: trace}\n", "arrivals.traceFile"),
        ("arrivals: {process: trace, traceFile: missing.jsonl}\n", "arrivals.traceFile"),
        ("cluster: {pdAccelerator: TPU9}\n", "cluster.pdAccelerator"),
        ("bogus: 1\n", "bogus"),
        ("[1, 2]\n", "mapping"),
        ("a: [\n", "invalid YAML"),
    ],
)
def test_bad_input_exits_1_naming_the_file_and_field_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, needle: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(body, encoding="utf-8")
    plots = tmp_path / "plots"
    code = main(["simulate", str(path), "--plot-dir", str(plots), "--no-search"])
    out, err = capsys.readouterr()
    assert code == 1
    assert out == ""
    assert str(path) in err and needle in err
    assert not plots.exists()


def test_a_bad_trace_line_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "t.jsonl").write_text('{"arrival_s": 0, "input_tokens": 0, "output_tokens": 1, "session_id": "a"}\n')
    path = tmp_path / "s.yaml"
    path.write_text("arrivals: {process: trace, traceFile: t.jsonl}\n", encoding="utf-8")
    assert main(["simulate", str(path), "--no-search"]) == 1
    err = capsys.readouterr().err
    assert "t.jsonl:1" in err and "input_tokens" in err


def test_a_missing_scenario_file_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(tmp_path / "nope.yaml")]) == 1
    assert "nope.yaml" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["bursty.yaml", "bandwidth-squeeze.yaml", "trace-replay.yaml"])
def test_example_scenarios_run(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(EX / name), "--quick", "--no-search", "--output", "json", "--jobs", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    for rep in (v for k, v in out.items() if k in DEPLOYMENTS):
        assert rep["completed"] == rep["requests"]
        assert rep["egress_peak_gbps"] <= out["link_capacity_gbps"] + 1e-6


def test_a_fleet_scenario_compares_fleet_routing_with_static_pairing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = yaml.safe_load((EX / "fleet.yaml").read_text(encoding="utf-8"))
    doc["search"] = {"durationSeconds": 60, "relativePrecision": 0.3}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    plots = tmp_path / "plots"
    assert main(["simulate", str(path), "-o", "json", "--plot-dir", str(plots)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["phase"] for p in out["phases"]] == ["steady", "squeeze", "cut", "site-lost"]
    assert out["over_cap"] == []
    lost = out["phases"][3]
    assert "site-1" not in lost["fleet"]["remote_by_site"] and lost["fleet"]["multiplier"] > 0
    assert (plots / "fleet-routing.png").read_bytes()[:4] == b"\x89PNG"
    doc["fleet"]["links"][0]["site"] = "site-9"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    assert main(["simulate", str(path)]) == 1
    assert "fleet.links[0].site" in capsys.readouterr().err
