"""`prfaas validate` as a user runs it: a real process, real files, exit codes and messages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EX = REPO / "examples" / "01-two-region"
INVALID = REPO / "tests" / "data" / "invalid"


def prfaas(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prfaas_cli.main", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )


def test_region_a_and_region_b_examples_are_valid() -> None:
    for region in ("region-a", "region-b"):
        result = prfaas("validate", str(EX / "common"), str(EX / region))
        assert result.returncode == 0, result.stdout + result.stderr
        assert "invalid" not in result.stdout + result.stderr


def test_both_regions_together_are_valid() -> None:
    # region A's Managed PrefillCluster and region B's Remote description share a name on two API servers
    result = prfaas("validate", str(EX), "-o", "json")
    report = json.loads(result.stdout)
    assert report["valid"] is True, result.stdout
    kinds = sorted(o["kind"] for o in report["objects"] if o["skipped"] is None)
    assert kinds == ["InterDCLink", "ModelProfile", "PDCluster", "PrefillCluster", "PrefillCluster"]


def test_two_managed_prefill_clusters_with_one_name_are_duplicates(tmp_path: Path) -> None:
    managed = (EX / "region-a" / "prefill-cluster.yaml").read_text()
    (tmp_path / "a.yaml").write_text(managed + "---\n" + managed)
    result = prfaas("validate", str(EX / "common"), str(tmp_path / "a.yaml"))
    assert result.returncode == 1 and "duplicate PrefillCluster 'prfaas-h200'" in result.stdout


@pytest.mark.parametrize("path", sorted(INVALID.glob("*.yaml"))[:6], ids=lambda p: p.stem)
def test_invalid_manifest_exits_1_naming_the_field(path: Path) -> None:
    expect = next(line.split()[2] for line in path.read_text().splitlines() if line.startswith("# expect:"))
    result = prfaas("validate", str(path))
    assert result.returncode == 1
    assert "FAIL" in result.stdout
    assert expect in result.stdout


def test_dangling_reference_is_reported(tmp_path: Path) -> None:
    link = (EX / "region-b" / "inter-dc-link.yaml").read_text().replace("name: pd-h20", "name: pd-h2O")
    (tmp_path / "link.yaml").write_text(link)
    result = prfaas(
        "validate",
        "--strict-references",
        str(EX / "common"),
        str(EX / "region-b" / "pd-cluster.yaml"),
        str(EX / "region-b" / "prefill-cluster-remote.yaml"),
        str(tmp_path / "link.yaml"),
    )
    assert result.returncode == 1
    assert "spec.pdClusterRef.name: PDCluster 'pd-h2O' in namespace 'prfaas' is not defined" in result.stdout


def test_duplicate_object_is_reported() -> None:
    pd = str(EX / "region-b" / "pd-cluster.yaml")
    result = prfaas("validate", str(EX / "common"), pd, pd)
    assert result.returncode == 1
    assert "duplicate PDCluster 'pd-h20'" in result.stdout


def test_missing_file_and_bad_yaml_exit_1(tmp_path: Path) -> None:
    result = prfaas("validate", str(tmp_path / "nope.yaml"))
    assert result.returncode == 1 and "no such file" in result.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: prfaas.io/v1alpha1\nkind: [unclosed\n")
    result = prfaas("validate", str(bad))
    assert result.returncode == 1
    assert "bad.yaml:" in result.stderr and "invalid YAML" in result.stderr


def test_unknown_kind_and_version(tmp_path: Path) -> None:
    f = tmp_path / "x.yaml"
    f.write_text(
        "apiVersion: prfaas.io/v1alpha1\nkind: PrefillClstr\nmetadata: {name: x}\n---\n"
        "apiVersion: prfaas.io/v9\nkind: PDCluster\nmetadata: {name: y}\n"
    )
    result = prfaas("validate", str(f))
    assert result.returncode == 1
    assert "unknown kind 'PrefillClstr'" in result.stdout
    assert "unsupported version 'prfaas.io/v9'" in result.stdout


def test_crds_check_detects_stale_files(tmp_path: Path) -> None:
    out = tmp_path / "crds"
    assert prfaas("crds", "--out", str(out)).returncode == 0
    assert prfaas("crds", "--out", str(out), "--check").returncode == 0
    target = out / "pdclusters.prfaas.io.yaml"
    target.write_text(target.read_text().replace("minimum: 1", "minimum: 2", 1))
    result = prfaas("crds", "--out", str(out), "--check")
    assert result.returncode == 1 and "stale" in result.stderr
