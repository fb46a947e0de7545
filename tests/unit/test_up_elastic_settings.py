"""``prfaas up``'s elastic capacity, without processes: the scenario's ``elastic`` block, the loops' settings from
it (the min is the stack's starting size; a max below it is refused naming both), the demand step found in the
phases, the delays read from the loops' samples, and a region's counters (increments by role, restarts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from prfaas_core.capacity.plan_inputs import case_study_inputs
from prfaas_core.policy.elastic import ScaleMemory
from prfaas_local.scenario import load_scenario, resolve
from prfaas_local.up_elastic import CapacitySample, _Region
from prfaas_local.up_elastic_report import delays, settings_of, step_and_fall

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "05-up" / "elastic.yaml"


def test_the_example_doubles_demand_and_the_settings_start_at_the_stacks_sizes() -> None:
    spec = load_scenario(EXAMPLE)
    assert spec.elastic is not None
    phases = resolve(spec, case_study_inputs().lengths)
    step, fall = step_and_fall(phases) or (None, None)
    assert (step, fall) == (20, 70)
    before, during = (p.load for p in phases[:2])
    assert during == pytest.approx(2 * before)
    s = settings_of(spec.elastic, 1, 2)
    assert (s.prfaas.min_instances, s.prfaas.max_instances, s.pd.min_instances, s.pd.max_instances) == (1, 3, 2, 4)
    with pytest.raises(ValueError, match=r"pdMaxInstances \(4\).*--pd 5"):
        settings_of(spec.elastic, 1, 5)


def test_the_step_is_the_first_rise_of_load() -> None:
    spec = load_scenario(REPO / "examples" / "05-up" / "phases.yaml")
    assert spec.elastic is None
    # the default scenario's loads go 0.4 -> 0.45 (a step) -> ... : step_and_fall finds the first rise
    assert step_and_fall(resolve(spec, case_study_inputs().lengths)) == (40, 190)


def test_delays_from_the_samples() -> None:
    samples = [
        CapacitySample(15, "pd", 2, 2, 1.0),
        CapacitySample(25, "pd", 3, 2, 2.6),  # asked 5 s after the step at 20
        CapacitySample(35, "pd", 3, 3, 2.7),  # ready 15 s after it
        CapacitySample(75, "pd", 2, 3, 0.9),  # in 5 s after the fall at 70, back at the start
        CapacitySample(80, "pd", 2, 2, 0.8),
    ]
    d = delays(samples, 20, 70, {"pd": 2, "prfaas": 1})
    assert d["pd"] == {
        "start": 2, "peak_desired": 3, "peak_ready": 3, "scale_out_asked_s": 5, "scale_out_ready_s": 15,
        "scale_in_asked_s": 5, "back_to_start_s": 5, "end_desired": 2,
    }  # fmt: skip
    assert d["prfaas"]["scale_out_asked_s"] is None and d["prfaas"]["end_desired"] == 1


def test_a_regions_counters_count_increments_by_role_and_survive_a_restart() -> None:
    r = _Region("pd", settings_of(load_scenario(EXAMPLE).elastic, 1, 2).pd, 2, ScaleMemory())
    r.count("pd-0", (1000.0, 2.0, 10.0), prefill=True)
    r.count("pd-1", (500.0, 1.0, 50.0), prefill=False)  # a decode engine's prompts are not prefill work
    r.count("pd-0", (1500.0, 3.0, 10.0), prefill=False)  # flipped to decode: its later prompts no longer count
    r.count("pd-1", (100.0, 0.0, 5.0), prefill=True)  # restarted (counter reset): counts from 0
    assert r.totals == [1100.0, 2.0, 65.0]
