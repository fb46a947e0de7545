"""`prfaas plan` on a fleet (examples/06-fleet: two sites, two PD regions, four links) as a user runs it: who sends
what where, t and the split per PD cluster, what binds, where capacity pays most; JSON and the table; bad demand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from prfaas_cli.main import main

FLEET = Path(__file__).resolve().parents[2] / "examples" / "06-fleet"


def test_the_fleet_example_plans_with_its_binding_caps(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(FLEET), "--demand", "pd-east=2", "--demand", "pd-west=1", "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["demand_fits"] and out["multiplier"] > 1
    east, west = (next(r for r in out["pd_clusters"] if r["name"] == n) for n in ("pd-east", "pd-west"))
    assert east["rate_rps"] == pytest.approx(2 * west["rate_rps"], rel=1e-3)  # the demand mix, scaled together
    assert east["n_prefill"] + east["n_decode"] == 8
    links = {x["name"]: x for x in out["links"]}
    assert set(links) == {"east-to-site-1", "east-to-site-2", "west-to-site-1", "west-to-site-2"}
    for x in links.values():
        assert x["egress_gbps"] <= x["cap_gbps"] * (1 + 1e-4)
        assert x["threshold_tokens"] == (east if x["pd_cluster"] == "pd-east" else west)["threshold_tokens"]
    site_1 = next(s for s in out["sites"] if s["name"] == "site-1")
    assert site_1["egress_gbps"] <= 10 * (1 + 1e-4)
    # the thin link and site 1's 10 Gbps cap bind; a wider site cap is what pays most
    assert "link east-to-site-2: its cap 8 Gbps" in out["binding"]
    assert "site site-1: its egress cap 10 Gbps" in out["binding"]
    assert out["added_capacity"][0]["resource"] == "site site-1 egress cap"
    assert out["added_capacity"][0]["fleet_rps_gain"] > 0

    assert main(["plan", str(FLEET)]) == 0  # the table: demand 1 per PD cluster
    table = capsys.readouterr().out
    assert table.startswith("Fleet: every PD cluster's demand x ") and "Where added capacity pays most" in table
    assert "east-to-site-2  pd-east -> site-2" in table


def test_a_drained_link_in_the_files_carries_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for path in FLEET.rglob("*.yaml"):
        doc = yaml.safe_load(path.read_text())
        if doc["kind"] == "InterDCLink" and doc["metadata"]["name"] == "east-to-site-1":
            doc["spec"]["drained"] = True
        target = tmp_path / path.relative_to(FLEET)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(yaml.safe_dump(doc))
    assert main(["plan", str(tmp_path), "-o", "yaml"]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    drained = next(x for x in out["links"] if x["name"] == "east-to-site-1")
    assert drained["drained"] and drained["rate_rps"] == 0


def test_a_bad_or_unknown_demand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(FLEET), "--demand", "pd-north=1"]) == 2
    assert "no PDCluster 'pd-north'" in capsys.readouterr().err
    assert main(["plan", str(FLEET), "--demand", "pd-east"]) == 2
    assert "PD=RPS" in capsys.readouterr().err
    assert main(["plan", str(FLEET), "--demand", "pd-east=50"]) == 1  # a demand that does not fit
    assert "does NOT fit" in capsys.readouterr().out
