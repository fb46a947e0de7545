"""Issue 4's Done-means on the example scenarios, and the validation against the analytic model (part 5).

Shorter probes and coarser searches than the CLI's defaults keep the default run fast; the full-length
versions are marked ``slow``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from prfaas_core.capacity.planner import compute_balanced_threshold, split_lengths
from prfaas_core.capacity.planner import evaluate as planner_point
from prfaas_core.sim.fleet_config import FleetScenario
from prfaas_core.sim.scenario import Scenario, TimeCurveSpec, default_scenario
from prfaas_core.sim.search import compare, compare_static_splits, evaluate, prepare, quick, run_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "02-simulate"


def load(name: str) -> Scenario:
    return Scenario.model_validate(yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8")))


def test_the_embedded_default_is_the_case_study_file() -> None:
    assert load("case-study.yaml").model_dump(exclude={"description"}) == default_scenario().model_dump(
        exclude={"description"}
    )


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_every_example_scenario_is_valid(name: str) -> None:
    doc = yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))
    model = FleetScenario if "fleet" in doc else Scenario  # a fleet (several sites and regions) is its own kind
    assert model.model_validate(doc).name == name.removesuffix(".yaml")


def test_default_scenario_goodput_beats_both_baselines_within_the_cap() -> None:
    sc = quick(default_scenario()).model_copy(
        update={"deployments": ["homogeneous_pd", "naive_heterogeneous", "prfaas_pd"]}
    )
    c = compare(sc)
    live, homog, naive = (c.deployments[n] for n in ("prfaas_pd", "homogeneous_pd", "naive_heterogeneous"))
    assert live.goodput_rps is not None and homog.goodput_rps and naive.goodput_rps
    assert live.goodput_rps >= 1.4 * homog.goodput_rps
    assert live.goodput_rps >= 1.2 * naive.goodput_rps
    for rep in c.deployments.values():
        assert rep.reference.egress_peak_gbps <= c.prepared.link_cap_gbps
        assert rep.reference.completed == rep.reference.arrived  # nothing dropped


def _planner_ceilings(prepared, rep) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Eqs. 3–6's rate ceilings per stage at the split in force where the queues first grew (the live role
    loop may have moved it; its t_min is then the Eq. 7 balance for that split)."""
    cfg, inputs = rep.config, prepared.planned.inputs
    n_p, n_d = cfg.n_prefill, cfg.n_decode
    t = {"local": 1 << 30, "remote": 0}.get(cfg.routing, cfg.threshold_tokens)
    unstable = sorted((p for p in rep.probes if not p.stable), key=lambda p: p.multiplier)
    if cfg.live_roles and unstable and unstable[0].prefill_end != n_p:
        n_p, n_d = unstable[0].prefill_end, unstable[0].decode_end
        t = compute_balanced_threshold(inputs, n_p) or t
    return planner_point(inputs, split_lengths(inputs, t), cfg.n_prfaas, n_p, n_d).rates()


@pytest.mark.parametrize("name", ["homogeneous_pd", "naive_heterogeneous", "prfaas_pd_static", "prfaas_pd"])
def test_with_uniform_arrivals_the_searched_capacity_matches_the_planner(name: str) -> None:
    sc = default_scenario()
    sc = sc.model_copy(
        update={
            "duration_seconds": 60.0,
            "arrivals": sc.arrivals.model_copy(update={"process": "uniform"}),
            "search": sc.search.model_copy(update={"duration_seconds": 900.0, "relative_precision": 0.04}),
        }
    )
    prepared = prepare(sc)
    rep = evaluate(prepared, name, goodput=False)
    assert rep.throughput_rps is not None
    assert rep.throughput_rps == pytest.approx(rep.planner_rps, rel=0.10)
    # the stage whose queue grows first is the planner's binding one (or one tied with it within 2 %)
    ceilings = _planner_ceilings(prepared, rep)
    lam = min(ceilings.values())
    binding = {stage for stage, rate in ceilings.items() if rate <= 1.02 * lam}
    assert rep.throughput_stage in binding


def test_bandwidth_squeeze_stays_under_capacity_and_the_new_cap_and_drops_nothing() -> None:
    sc = load("bandwidth-squeeze.yaml")
    prepared = prepare(sc)
    cut_s, new_capacity = sc.link.schedule[0].at_seconds, sc.link.schedule[0].capacity_gbps
    new_cap = new_capacity * sc.link.max_utilization
    for name in ("prfaas_pd_static", "prfaas_pd"):
        result, _, requests = run_config(prepared, prepared.planned.configs[name], 1.0, sc.duration_seconds)
        s = result.series
        assert result.completed == len(requests)  # nothing dropped
        assert result.link_max_over_capacity_gbps <= 1e-6
        for t, egress, capacity in zip(s.time_s, s.egress_gbps, s.capacity_gbps, strict=True):
            assert egress <= capacity + 1e-6, (name, t)  # the link never carries more than its capacity
        # the streams in flight at the cut finish within a few seconds; then admission holds the new cap
        drained_s = cut_s + 10.0
        after = [e for t, e in zip(s.time_s, s.egress_gbps, strict=True) if t > drained_s]
        assert max(after) <= new_cap + 1e-6, name
        assert max(e for t, e in zip(s.time_s, s.egress_gbps, strict=True) if t < cut_s) > new_cap  # it had to act
    # the live threshold rises above t_min after the cut
    result, _, _ = run_config(prepared, prepared.planned.configs["prfaas_pd"], 1.0, sc.duration_seconds)
    s = result.series
    before = max(t for ts, t in zip(s.time_s, s.threshold_tokens, strict=True) if ts < cut_s)
    after_t = max(t for ts, t in zip(s.time_s, s.threshold_tokens, strict=True) if cut_s < ts < sc.duration_seconds)
    assert after_t > before


def _compressed(sc: Scenario, factor: float) -> Scenario:
    def scale(c: TimeCurveSpec | None) -> TimeCurveSpec | None:
        if c is None or c.period_seconds is None:
            return c
        points = [p.model_copy(update={"at_seconds": p.at_seconds * factor}) for p in c.points]
        return c.model_copy(update={"period_seconds": c.period_seconds * factor, "points": points})

    return sc.model_copy(
        update={
            "duration_seconds": sc.duration_seconds * factor,
            "arrivals": sc.arrivals.model_copy(update={"rate_curve": scale(sc.arrivals.rate_curve)}),
            "workload": [w.model_copy(update={"weight_curve": scale(w.weight_curve)}) for w in sc.workload],
        }
    )


def _live_vs_best_static(sc: Scenario) -> tuple[float, float]:
    prepared = prepare(sc)
    live = evaluate(prepared, "prfaas_pd", search=False)
    static = compare_static_splits(prepared, live, search=False)
    assert set(static.attainment) == set(range(1, sc.cluster.pd_instances))  # every prefill count was tried
    assert live.reference.role_flips >= 2  # it followed the mix
    return static.live_attainment, static.attainment[static.best_prefill]


def test_diurnal_live_role_flipping_beats_the_best_static_split_on_a_shorter_day() -> None:
    live, best = _live_vs_best_static(_compressed(load("diurnal.yaml"), 0.35))
    assert live > 1.1 * best


@pytest.mark.slow
def test_diurnal_live_role_flipping_beats_the_best_static_split() -> None:
    live, best = _live_vs_best_static(load("diurnal.yaml"))
    assert live > 1.1 * best
