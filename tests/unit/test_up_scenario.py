"""``prfaas up``'s scenario file (phases, inheritance, errors naming the field), its trace, and the local loop's
observed length mix read from the router's histogram."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from prfaas_core.capacity.plan_inputs import case_study_inputs
from prfaas_core.capacity.workload import TruncatedLogNormal
from prfaas_core.names import METRIC_ROUTER_UNCACHED_TOKENS, UNCACHED_TOKEN_BUCKETS
from prfaas_local.local_loop import MIN_MIX_REQUESTS, _buckets, mix_between
from prfaas_local.scenario import DEFAULT_SCENARIO, ScenarioError, generate_trace, load_scenario, resolve

REPO = Path(__file__).resolve().parents[2]


def test_the_default_scenario_is_the_example_and_has_the_four_phases() -> None:
    assert (REPO / "examples" / "05-up" / "phases.yaml").read_text() == DEFAULT_SCENARIO.read_text()
    spec = load_scenario(DEFAULT_SCENARIO)
    phases = resolve(spec, case_study_inputs().lengths)
    assert [p.name for p in phases] == ["steady", "long-prompts", "squeeze", "recovery"]
    assert phases[0].start_s == 0 and all(a.end_s == b.start_s for a, b in itertools.pairwise(phases))
    # fields a phase leaves out are inherited: the squeeze keeps the long prompts' mix and load, not the link
    long_prompts, squeeze, recovery = phases[1], phases[2], phases[3]
    assert squeeze.load == long_prompts.load and squeeze.lengths == long_prompts.lengths
    assert squeeze.link_gbps < recovery.link_gbps == spec.link_gbps
    assert recovery.lengths == phases[0].lengths
    # a long-prompt mix: its median is above the steady one's
    assert phases[1].lengths.quantile(0.5) > 1.5 * phases[0].lengths.quantile(0.5)
    # about 4 minutes of wall time at most with its clock
    assert phases[-1].end_s / spec.time_scale <= 200


def test_trace_follows_each_phase_rate_and_mix() -> None:
    phases = resolve(load_scenario(DEFAULT_SCENARIO), case_study_inputs().lengths)
    records = generate_trace(phases, 1.71, 512, seed=3)
    assert [r.arrival_s for r in records] == sorted(r.arrival_s for r in records)
    for p in phases:
        inside = [r for r in records if p.start_s <= r.arrival_s < p.end_s]
        expected = p.load * 1.71 * (p.end_s - p.start_s)
        assert 0.6 * expected < len(inside) < 1.4 * expected, p.name
    long = [r.input_tokens for r in records if phases[1].contains(r.arrival_s)]
    steady = [r.input_tokens for r in records if phases[0].contains(r.arrival_s)]
    assert sorted(long)[len(long) // 2] > sorted(steady)[len(steady) // 2]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("phases: []", "phases"),
        ("phases: [{name: a, durationSeconds: 10}]", "load is required"),
        ("phases: [{name: a, durationSeconds: -1, load: 0.5}]", "phases.0.durationSeconds"),
        ("phases: [{name: a, durationSeconds: 1, load: 0.5, linkGbps: 0}]", "phases.0.linkGbps"),
        ("phases: [{name: a, durationSeconds: 1, load: 0.5}, {name: a, durationSeconds: 1}]", "unique"),
        ("phases: [{name: a, durationSeconds: 1, load: 0.5, bogus: 1}]", "phases.0.bogus"),
        ("{{", "--scenario"),
    ],
)
def test_bad_scenarios_name_the_field(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError, match=needle.replace(".", r"\.")):
        resolve(load_scenario(path), case_study_inputs().lengths)


def _metrics(lengths: list[int]) -> str:
    lines = []
    for le in [*UNCACHED_TOKEN_BUCKETS, "+Inf"]:
        bound = float("inf") if le == "+Inf" else float(le)
        n = sum(1 for x in lengths if x <= bound)
        label = "+Inf" if le == "+Inf" else f"{float(le)}"
        lines.append(f'{METRIC_ROUTER_UNCACHED_TOKENS}_bucket{{le="{label}"}} {float(n)}')
    return "\n".join(lines)


def test_observed_mix_is_fitted_from_the_routers_buckets_between_two_readings() -> None:
    declared = case_study_inputs().lengths
    rng = random.Random(5)
    early = [TruncatedLogNormal(9.9, 1.0, 128, 131072).sample(rng) for _ in range(50)]
    late = [TruncatedLogNormal(10.6, 0.7, 128, 131072).sample(rng) for _ in range(60)]
    before, after = _buckets(_metrics(early)), _buckets(_metrics(early + late))
    mix = mix_between(before, after, declared)
    assert isinstance(mix, TruncatedLogNormal)
    assert mix.support() == declared.support()
    assert 10.3 < mix.mu < 10.9 and 0.4 < mix.sigma < 1.1  # the late requests only
    # too few requests, or a counter that went back (a restart): no observation
    assert mix_between(before, _buckets(_metrics(early + late[: MIN_MIX_REQUESTS - 1])), declared) is None
    assert mix_between(after, before, declared) is None
