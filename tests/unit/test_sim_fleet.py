"""The fleet simulation (prfaas_core.sim.fleet) on examples/02-simulate/fleet.yaml, short runs: a cut link carries
nothing and its region's remote prefills go to the other site, a lost or drained site takes no work, static pairing
uses only the paired links, every link and site stays within its cap in every 1-s window; bad graphs are refused
naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from prfaas_core.sim.fleet import FleetRun, goodput, run_fleet
from prfaas_core.sim.fleet_config import FleetPhaseSpec, FleetScenario
from prfaas_core.sim.fleet_report import balanced_pairing

EXAMPLE = Path(__file__).resolve().parents[2] / "examples/02-simulate/fleet.yaml"


@pytest.fixture(scope="module")
def scn() -> FleetScenario:
    return FleetScenario.model_validate(yaml.safe_load(EXAMPLE.read_text(encoding="utf-8")))


def phase(scn: FleetScenario, name: str) -> FleetPhaseSpec:
    return next(p for p in scn.fleet.phases if p.name == name)


def within_caps(run: FleetRun) -> None:
    for name, bins in run.link_bins.items():
        assert run.peak(bins) <= run.link_caps[name] + 1e-6, name
    for name, bins in run.site_bins.items():
        assert run.peak(bins) <= run.site_caps[name] + 1e-6, name


def test_cut_link_moves_its_region_to_the_other_site(scn: FleetScenario) -> None:
    run = run_fleet(scn, phase(scn, "cut"), "fleet", 1.0, 120.0)
    assert run.peak(run.link_bins["region-1/site-1"]) == 0.0
    assert run.peak(run.link_bins["region-1/site-2"]) > 0.0
    within_caps(run)
    assert all(run.attainment(r) >= 0.9 for r in run.requests)


def test_lost_and_drained_sites_take_no_work(scn: FleetScenario) -> None:
    lost = run_fleet(scn, phase(scn, "site-lost"), "fleet", 1.0, 120.0)
    assert "site-1" not in lost.remote and lost.remote["site-2"] > 0
    drained = run_fleet(scn, FleetPhaseSpec(name="drain", drained_sites=["site-2"]), "fleet", 1.0, 120.0)
    assert "site-2" not in drained.remote and drained.remote["site-1"] > 0
    within_caps(lost)
    within_caps(drained)


def test_static_pairing_uses_only_the_paired_links(scn: FleetScenario) -> None:
    run = run_fleet(scn, phase(scn, "steady"), "static", 1.0, 120.0)
    assert set(run.link_bins) == {"region-1/site-1", "region-2/site-1", "region-3/site-2"}
    within_caps(run)


def test_goodput_search_brackets_and_fleet_beats_static_after_a_cut(scn: FleetScenario) -> None:
    fleet = goodput(scn, phase(scn, "cut"), "fleet", duration_s=60.0, precision=0.3)
    static = goodput(scn, phase(scn, "cut"), "static", duration_s=60.0, precision=0.3)
    assert fleet.best is not None and fleet.multiplier > static.multiplier
    assert fleet.link_peaks["region-1/site-1"] == 0.0


def test_the_balanced_example_is_deterministic_and_static_binds_one_region_per_site() -> None:
    doc = yaml.safe_load((EXAMPLE.parent / "fleet-balanced.yaml").read_text(encoding="utf-8"))
    bal = FleetScenario.model_validate(doc)
    assert balanced_pairing(bal.fleet) and not balanced_pairing(
        FleetScenario.model_validate(yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))).fleet
    )
    for mode in ("fleet", "static"):
        runs = [run_fleet(bal, bal.fleet.phases[0], mode, 2.0, 60.0) for _ in range(2)]
        assert runs[0] == runs[1] and sum(runs[0].remote.values()) > 0  # the same seeds: the same run
        within_caps(runs[0])
    static = run_fleet(bal, bal.fleet.phases[0], "static", 2.0, 60.0)
    assert set(static.link_bins) == {"region-1/site-1", "region-2/site-2"}


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"links": [{"region": "nowhere", "site": "site-1"}]}, "fleet.links[0].region"),
        ({"links": [{"region": "region-1", "site": "site-1"}] * 2}, "one link per pair"),
        ({"staticPairing": {"region-1": "site-9"}}, "fleet.staticPairing.region-1"),
        ({"sites": [{"name": "site-1", "siteEgressCapGbps": -1}]}, "siteEgressCapGbps"),
    ],
)
def test_bad_graph_names_the_field(patch: dict[str, object], field: str) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    doc["fleet"].update(patch)
    with pytest.raises(ValidationError, match=field.replace("[", r"\[").replace("]", r"\]")):
        FleetScenario.model_validate(doc)
