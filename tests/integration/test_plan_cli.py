"""`prfaas plan` as a user runs it: the case study, manifests, workloads, plots and bad input (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prfaas_cli.main import main

REPO = Path(__file__).resolve().parents[2]
EX = REPO / "examples" / "01-two-region"
REGION_B = [str(EX / "common"), str(EX / "region-b")]


def prfaas(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prfaas_cli.main", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:  # type: ignore[type-arg]
    assert main(["plan", "--output", "json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_case_study_json_reproduces_table6() -> None:
    result = prfaas("plan", "--output", "json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)  # stdout holds only JSON
    p, h, n = out["prfaas_pd"], out["homogeneous_pd"], out["naive_heterogeneous"]
    assert p["threshold_tokens"] == pytest.approx(19_400, rel=0.03)
    assert (p["n_prfaas"], p["n_prefill"], p["n_decode"]) == (4, 3, 5)
    assert p["throughput_rps"] == pytest.approx(3.24, rel=0.03)
    assert p["offload_fraction"] == pytest.approx(0.496, rel=0.03)
    assert p["l_long_tokens"] / 1024 == pytest.approx(44, rel=0.03)
    assert p["l_short_tokens"] == pytest.approx(10_224, rel=0.03)
    assert (p["ttft_mean_s"], p["ttft_p90_s"]) == (pytest.approx(2.22, rel=0.03), pytest.approx(3.51, rel=0.03))
    assert p["egress_gbps"] == pytest.approx(13, rel=0.10)
    assert p["binding"] in ("prfaas-compute", "pd-prefill")
    assert (p["theta_prfaas"], p["theta_pd_p"], p["theta_pd_d"]) == (
        pytest.approx(1.61, rel=0.03),
        pytest.approx(1.64, rel=0.03),
        pytest.approx(3.91, rel=0.03),
    )
    assert (h["n_prefill"], h["n_decode"]) == (9, 3)
    assert h["throughput_rps"] == pytest.approx(2.11, rel=0.03)
    assert (h["ttft_mean_s"], h["ttft_p90_s"]) == (pytest.approx(4.44, rel=0.03), pytest.approx(9.73, rel=0.03))
    assert n["throughput_rps"] == pytest.approx(2.45, rel=0.03)
    assert (n["ttft_mean_s"], n["ttft_p90_s"]) == (pytest.approx(1.74, rel=0.03), pytest.approx(3.51, rel=0.03))
    assert out["ratios_vs_homogeneous"]["prfaas_pd"]["throughput"] == pytest.approx(1.54, rel=0.03)
    assert out["ratios_vs_homogeneous"]["naive_heterogeneous"]["throughput"] == pytest.approx(1.16, rel=0.03)
    assert out["inputs"]["link_capacity_gbps"] == 100
    assert out["inputs"]["usable_egress_gbps"] == 80


def test_example_manifests_plan_like_the_case_study(capsys: pytest.CaptureFixture[str]) -> None:
    from_files = run_json(capsys, *REGION_B)
    case = run_json(capsys)
    assert from_files["inputs"]["model"] == "hybrid-1t"
    for key in ("threshold_tokens", "throughput_rps", "n_prefill", "n_decode", "egress_gbps"):
        assert from_files["prfaas_pd"][key] == case["prfaas_pd"][key]


def test_link_gbps_10_raises_the_threshold_and_keeps_egress_under_the_cap(capsys: pytest.CaptureFixture[str]) -> None:
    fat = run_json(capsys)
    thin = run_json(capsys, "--link-gbps", "10")
    assert thin["prfaas_pd"]["threshold_tokens"] > fat["prfaas_pd"]["threshold_tokens"]
    assert thin["prfaas_pd"]["egress_gbps"] <= 10 * 0.8 + 1e-6
    assert thin["inputs"]["link_capacity_gbps"] == 10


def test_manifest_with_a_10_gbps_link(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    link = (EX / "region-b" / "inter-dc-link.yaml").read_text()
    assert "capacityGbps: 100" in link
    (tmp_path / "link.yaml").write_text(link.replace("capacityGbps: 100", "capacityGbps: 10"))
    files = [str(EX / "common"), str(EX / "region-b" / "pd-cluster.yaml")]
    files += [str(EX / "region-b" / "prefill-cluster-remote.yaml"), str(tmp_path / "link.yaml")]
    fat = run_json(capsys, *REGION_B)
    thin = run_json(capsys, *files)
    assert thin["prfaas_pd"]["threshold_tokens"] > fat["prfaas_pd"]["threshold_tokens"]
    assert thin["prfaas_pd"]["egress_gbps"] <= 10 * 0.8 + 1e-6
    assert thin["prfaas_pd"]["threshold_bandwidth_floor_tokens"] > thin["prfaas_pd"]["threshold_balanced_tokens"]


def test_table_output_is_aligned(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(line for line in lines if "PrFaaS-PD" in line and "Homogeneous PD" in line)
    col = header.index("PrFaaS-PD")
    body = [line for line in lines if line.startswith(("Λ_max", "Threshold", "Mean / P90"))]
    assert len(body) == 3
    assert all(line[col - 2 : col] == "  " and line[col] != " " for line in body)
    assert "prfaas-compute" in out or "pd-prefill" in out


def test_plot_dir_writes_fig5_pngs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "plots"
    assert main(["plan", "--plot-dir", str(out_dir), "--output", "json"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)  # JSON only on stdout even with plots
    pngs = sorted(p.name for p in out_dir.iterdir())
    assert pngs == ["fig5a-lambda-vs-np.png", "fig5b-lambda-vs-threshold.png"]
    assert all((out_dir / p).read_bytes().startswith(b"\x89PNG") for p in pngs)
    assert "wrote" in captured.err


def test_workload_yaml_and_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "w.yaml").write_text(
        "inputLength:\n  logNormal: {mu: 9.9, sigma: 1.0, minTokens: 128, maxTokens: 131072}\n"
        "outputTokens: 2048\narrivalRatePerSecond: 1.5\n"
    )
    out = run_json(capsys, "--workload", str(tmp_path / "w.yaml"))
    assert out["inputs"]["output_tokens"] == 2048
    assert out["at_arrival_rate"]["feasible"] is True
    lines = [
        json.dumps({"arrival_s": i * 0.5, "input_tokens": 4000 + 1000 * i, "output_tokens": 512, "session_id": "s"})
        for i in range(60)
    ]
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    out = run_json(capsys, "--workload", str(tmp_path / "t.jsonl"))
    assert out["inputs"]["mean_input_tokens"] == pytest.approx(4000 + 1000 * 29.5)
    assert out["at_arrival_rate"]["arrival_rate_per_second"] == pytest.approx(2.0)


def test_list_hardware(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--list-hardware", "--output", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {r["accelerator"]: r for r in rows}
    assert by_name["H20"]["decode_tokens_per_second"] == 800
    assert by_name["H200"]["prefill_seconds"]["32K"] == 1.84
    assert main(["plan", "--list-hardware"]) == 0
    assert "H200" in capsys.readouterr().out


# --- Bad input: exit 1 (2: a usage error), a message naming the file and field, nothing written -----------------


def _fails(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str, code: int = 1) -> str:
    plots = tmp_path / "plots"
    assert main(["plan", "--plot-dir", str(plots), "--output", "json", *args]) == code
    captured = capsys.readouterr()
    assert captured.out == ""
    assert not plots.exists()
    return captured.err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "nope.yaml: no such file" in _fails(capsys, tmp_path, str(tmp_path / "nope.yaml"))


def test_bad_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.yaml").write_text("kind: [unclosed\n")
    assert "bad.yaml:" in _fails(capsys, tmp_path, str(tmp_path / "bad.yaml"))


def test_invalid_manifest_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    link = (EX / "region-b" / "inter-dc-link.yaml").read_text().replace("capacityGbps: 100", "capacityGbps: -5")
    (tmp_path / "link.yaml").write_text(link)
    files = [str(EX / "common"), str(EX / "region-b" / "pd-cluster.yaml")]
    files += [str(EX / "region-b" / "prefill-cluster-remote.yaml"), str(tmp_path / "link.yaml")]
    err = _fails(capsys, tmp_path, *files)
    assert "link.yaml" in err and "spec.capacityGbps" in err


def test_unknown_hardware_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pd = (EX / "region-b" / "pd-cluster.yaml").read_text().replace("accelerator: H20", "accelerator: X9")
    (tmp_path / "pd.yaml").write_text(pd)
    files = [str(EX / "common"), str(tmp_path / "pd.yaml")]
    files += [str(EX / "region-b" / "prefill-cluster-remote.yaml"), str(EX / "region-b" / "inter-dc-link.yaml")]
    err = _fails(capsys, tmp_path, *files)
    assert "PDCluster spec.hardware.accelerator: 'X9' has no built-in profile" in err
    assert "spec.hardware.prefillTime" in err


def test_missing_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _fails(capsys, tmp_path, str(EX / "common"), str(EX / "region-b" / "pd-cluster.yaml"))
    assert "need exactly one PrefillCluster, found 0" in err


def test_both_regions_at_once_plan_from_region_b_view(capsys: pytest.CaptureFixture[str]) -> None:
    # region A's Managed PrefillCluster and region B's Remote description are one cluster seen from two API
    # servers: planning both folders equals planning region B's
    assert main(["plan", "--output", "json", *REGION_B]) == 0
    region_b = json.loads(capsys.readouterr().out)
    assert main(["plan", "--output", "json", str(EX)]) == 0
    both = json.loads(capsys.readouterr().out)
    assert both == region_b


def test_regions_that_disagree_on_the_prefill_cluster_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    remote = (EX / "region-b" / "prefill-cluster-remote.yaml").read_text().replace("instances: 4", "instances: 6")
    (tmp_path / "remote.yaml").write_text(remote)
    files = [str(EX / "common"), str(EX / "region-a"), str(tmp_path / "remote.yaml")]
    files += [str(EX / "region-b" / f) for f in ("pd-cluster.yaml", "inter-dc-link.yaml")]
    err = _fails(capsys, tmp_path, *files)
    assert "different instances or hardware" in err


def test_bad_workload_yaml_names_file_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "w.yaml").write_text("inputLength:\n  logNormal: {sigma: -1}\n")
    err = _fails(capsys, tmp_path, "--workload", str(tmp_path / "w.yaml"))
    assert "w.yaml: inputLength.logNormal.sigma" in err


def test_bad_trace_names_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = json.dumps({"arrival_s": 0, "input_tokens": 10, "output_tokens": 1, "session_id": "s"})
    (tmp_path / "t.jsonl").write_text(good + "\n" + '{"arrival_s": 1, "input_tokens": "x"}\n')
    err = _fails(capsys, tmp_path, "--workload", str(tmp_path / "t.jsonl"))
    assert "t.jsonl:2: field 'input_tokens'" in err


def test_non_positive_link_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "--link-gbps" in _fails(capsys, tmp_path, "--link-gbps", "0", code=2)


def test_plot_dir_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "f").write_text("x")
    assert main(["plan", "--plot-dir", str(tmp_path / "f")]) == 1
    assert "not a directory" in capsys.readouterr().err


def test_plan_within_a_budget_and_for_a_rate(capsys: pytest.CaptureFixture[str]) -> None:
    prices = ["--prfaas-price", "40", "--pd-price", "16"]
    out = run_json(capsys, "--budget", "300", *prices, "--max-prfaas", "4", "--max-pd", "16")
    assert out["found"] and out["costPerHour"] <= 300 and out["throughputRps"] > 0
    small = ["--max-prfaas", "4", "--max-pd", "16"]
    out = run_json(capsys, "--cheapest-for-rate", "2", *prices, "--link-price-per-gb", "0.002", *small)
    assert out["found"] and out["throughputRps"] >= 2
    assert out["costPerHour"] == pytest.approx(out["instancesPerHour"] + out["linkPerHour"])
    # bad input names the option; a budget without prices names the field
    assert main(["plan", "--budget", "-1", *prices]) == 2
    assert "--budget" in capsys.readouterr().err
    assert main(["plan", "--budget", "300"]) == 1
    assert "pricePerInstanceHour" in capsys.readouterr().err
    assert main(["plan", "--budget", "10", *prices, *small]) == 1  # nothing fits
