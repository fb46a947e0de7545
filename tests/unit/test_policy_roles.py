"""The long-term role policy and loop: verdicts, hysteresis, cooldown, bounds, drain, flip, t re-optimised."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from prfaas_core.capacity.plan_inputs import case_study_inputs
from prfaas_core.capacity.workload import EmpiricalDistribution
from prfaas_core.policy.long_term import LoopDecision, LoopState, LoopTick, step
from prfaas_core.policy.role_types import (
    InstanceState,
    RoleDecision,
    RoleObservation,
    RolePolicyParams,
    RoleState,
    StageLoad,
)
from prfaas_core.policy.roles import decide_roles

INPUTS = case_study_inputs()
PARAMS = RolePolicyParams(hysteresis_cycles=2, cooldown_s=300, drain_timeout_s=120, prefill_min=1, decode_min=1)
T = 19_400


def instances(n_p: int, n_d: int, busy: dict[str, int] | None = None, draining: set[str] = frozenset()) -> tuple:  # type: ignore[assignment]
    busy = busy or {}
    out = [InstanceState(f"p{i}", "prefill", busy.get(f"p{i}", 0), f"p{i}" in draining) for i in range(n_p)]
    out += [InstanceState(f"d{i}", "decode", busy.get(f"d{i}", 0), f"d{i}" in draining) for i in range(n_d)]
    return tuple(out)


def obs(n_p: int = 3, n_d: int = 5, pq: float = 0, dq: float = 0, fq: float = 0, **kw: object) -> RoleObservation:
    return RoleObservation(instances(n_p, n_d, **kw), StageLoad(pq), StageLoad(dq), StageLoad(fq))  # type: ignore[arg-type]


def test_paper_split_with_no_queues_holds_as_balanced() -> None:
    o = RoleObservation(instances(3, 5), arrival_rate_rps=2.5)
    d = decide_roles(RoleState(), o, PARAMS, INPUTS, T, 0.0)
    assert d.action == "Hold" and d.reason.startswith("balanced")
    assert d.prefill_to == 3 and d.decode_to == 5
    assert d.ratio == pytest.approx(3.25 / 3.91, rel=0.05)
    assert d.threshold_min_tokens is not None and 18_000 < d.threshold_min_tokens < 21_000


def test_a_model_lean_that_flips_nothing_says_why_in_words_that_match_the_ratio() -> None:
    """32 output tokens: decode is far from its limit, the ratio is tiny (prefill-bound by the model), but
    with decode at its one instance there is nothing to flip — the reason says so instead of 'balanced'."""
    from dataclasses import replace

    short = replace(INPUTS, n_prfaas=2, n_pd=4, output_tokens=32.0)
    o = RoleObservation(instances(3, 1), arrival_rate_rps=0.9)
    d = decide_roles(RoleState(), o, PARAMS, short, 29_439, 0.0)
    assert d.action == "Hold"
    assert d.ratio is not None and d.ratio < PARAMS.flip_to_prefill_ratio
    assert "balanced" not in d.reason
    assert f"= {d.ratio:.2f} < 0.8 leans prefill-bound, but decode is at one instance" in d.reason
    # with room to flip but no gain, the reason names Λ_max before and after
    o2 = RoleObservation(instances(2, 2), arrival_rate_rps=0.9)
    d2 = decide_roles(RoleState(), o2, PARAMS, replace(short, output_tokens=512.0), 23_220, 0.0)
    assert d2.action == "Hold" and "would lower Λ_max (1.71 -> 1.56 req/s)" in d2.reason, d2.reason


def test_decode_queue_drains_then_flips_a_prefill_instance() -> None:
    s = RoleState()
    d1 = decide_roles(s, obs(dq=40), PARAMS, INPUTS, T, 0.0)
    assert d1.action == "Hold" and "1 of 2 cycles" in d1.reason
    d2 = decide_roles(d1.state, obs(dq=40, busy={"p0": 3, "p1": 0, "p2": 1}), PARAMS, INPUTS, T, 60.0)
    assert d2.action == "Drain" and d2.drain == ("p1",)  # least in flight goes first
    assert "decode-bound" in d2.reason
    d3 = decide_roles(d2.state, obs(dq=40, busy={"p1": 2}, draining={"p1"}), PARAMS, INPUTS, T, 65.0)
    assert d3.action == "Drain" and "2 in flight" in d3.reason and not d3.flip
    d4 = decide_roles(d3.state, obs(dq=40, draining={"p1"}), PARAMS, INPUTS, T, 70.0)
    assert d4.action == "FlipToDecode" and d4.flip == (("p1", "decode"),)
    assert (d4.prefill_to, d4.decode_to) == (2, 6)
    assert "drained" in d4.reason
    # fewer PD-P instances -> more must go to PrFaaS: t_min falls
    assert d4.threshold_min_tokens is not None and d1.threshold_min_tokens is not None
    assert d4.threshold_min_tokens < d1.threshold_min_tokens
    # cooldown: the queue persists, but no flip before 300 s
    d5 = decide_roles(d4.state, obs(2, 6, dq=40), PARAMS, INPUTS, T, 130.0)
    d6 = decide_roles(d5.state, obs(2, 6, dq=40), PARAMS, INPUTS, T, 190.0)
    assert d6.action == "Hold" and "cooldown" in d6.reason


def test_drain_timeout_with_requests_in_flight_aborts_the_flip() -> None:
    """Never flip an instance that still serves requests: at the drain timeout the flip is aborted, the
    instance stops draining in its old role, the reason says why, and the verdict must build up again."""
    s = RoleState(verdict="prefill-bound", streak=5, last_flip_s=-1000.0)
    d = decide_roles(s, obs(pq=50), PARAMS, INPUTS, T, 0.0)
    assert d.action == "Drain" and d.drain[0].startswith("d")
    victim = d.drain[0]
    d2 = decide_roles(d.state, obs(pq=50, busy={victim: 4}, draining={victim}), PARAMS, INPUTS, T, 121.0)
    assert d2.action == "Hold" and d2.flip == () and d2.undrain == (victim,)
    assert "drain timeout" in d2.reason and "4 in flight" in d2.reason and "flip aborted" in d2.reason
    assert (d2.prefill_to, d2.decode_to) == (d2.prefill_from, d2.decode_from)
    assert d2.state.pending is None and d2.state.streak == 0 and d2.state.last_flip_s == -1000.0
    # the next cycle judges afresh: hysteresis again before another drain
    d3 = decide_roles(d2.state, obs(pq=50), PARAMS, INPUTS, T, 130.0)
    assert d3.action == "Hold" and "cycles)" in d3.reason


def test_a_drained_instance_flips_before_the_timeout() -> None:
    s = RoleState(verdict="prefill-bound", streak=5)
    d = decide_roles(s, obs(pq=50), PARAMS, INPUTS, T, 0.0)
    victim = d.drain[0]
    d2 = decide_roles(d.state, obs(pq=50, draining={victim}), PARAMS, INPUTS, T, 10.0)
    assert d2.action == "FlipToPrefill" and "drained" in d2.reason and d2.undrain == ()
    assert (d2.prefill_to, d2.decode_to) == (4, 4)


def test_bounds_hold_the_flip() -> None:
    params = RolePolicyParams(hysteresis_cycles=1, prefill_min=3)
    d = decide_roles(RoleState(), obs(dq=40), params, INPUTS, T, 0.0)
    assert d.action == "Hold" and "minimum" in d.reason


def test_both_stages_queueing_asks_for_hardware() -> None:
    d = decide_roles(RoleState(), obs(pq=50, dq=50), PARAMS, INPUTS, T, 0.0)
    assert d.action == "Hold" and "more hardware" in d.reason


def test_prfaas_queue_counts_as_prefill_pressure() -> None:
    d = decide_roles(RoleState(), obs(fq=40), PARAMS, INPUTS, T, 0.0)
    assert "prefill-bound" in d.reason


def test_suspend_only_observes() -> None:
    d = decide_roles(RoleState(), obs(dq=100), RolePolicyParams(suspend=True), INPUTS, T, 0.0)
    assert d.action == "Suspended" and not d.drain and not d.flip


def test_model_verdict_on_a_short_mix_moves_toward_decode() -> None:
    short = EmpiricalDistribution.from_lengths([1500, 2000, 2500, 3000] * 25)
    o = RoleObservation(instances(3, 5), lengths=short, arrival_rate_rps=3.0)
    d = decide_roles(RoleState(verdict="decode-bound", streak=1), o, PARAMS, INPUTS, 1000, 0.0)
    assert d.action == "Drain", d.reason
    assert "by the model" in d.reason and d.ratio is not None and d.ratio > PARAMS.flip_to_decode_ratio


def test_the_model_alone_flips_nothing_without_an_observed_arrival_rate() -> None:
    short = EmpiricalDistribution.from_lengths([1500, 2000, 2500, 3000] * 25)
    o = RoleObservation(instances(3, 5), lengths=short)
    d = decide_roles(RoleState(verdict="decode-bound", streak=1), o, PARAMS, INPUTS, 1000, 0.0)
    assert d.action == "Hold" and "arrival rate unknown" in d.reason


def test_a_verdict_that_changes_resets_the_streak() -> None:
    d1 = decide_roles(RoleState(), obs(dq=40), PARAMS, INPUTS, T, 0.0)
    d2 = decide_roles(d1.state, obs(pq=40), PARAMS, INPUTS, T, 60.0)
    assert d2.action == "Hold" and d2.state.streak == 1 and d2.state.verdict == "prefill-bound"


@dataclass
class ScriptedCluster:
    """Test double: an in-memory cluster that gives the observation and carries out the effects."""

    roles: dict[str, str]
    decode_queue: float = 40.0
    applied: list[RoleDecision] = field(default_factory=list)
    draining: set[str] = field(default_factory=set)

    def observe(self, now_s: float) -> RoleObservation:
        insts = tuple(InstanceState(n, r, 0, n in self.draining) for n, r in sorted(self.roles.items()))  # type: ignore[arg-type]
        return RoleObservation(insts, decode=StageLoad(self.decode_queue))

    def apply(self, effects: LoopDecision, now_s: float) -> None:
        if effects.roles is None or not effects.act:
            return
        decision = effects.roles
        self.applied.append(decision)
        self.draining |= set(decision.drain)
        for name, role in decision.flip:
            self.roles[name] = role
            self.draining.discard(name)


def run_once(
    cluster: ScriptedCluster, params: RolePolicyParams, state: LoopState, now_s: float, history_limit: int = 20
) -> LoopDecision:
    """What every shell does: observe, the core's step, carry out the effects."""
    tick = LoopTick(now_s, params, INPUTS, state, cluster.observe(now_s), float(T), history_limit=history_limit)
    decision = step(tick)
    cluster.apply(decision, now_s)
    return decision


def test_loop_runs_observe_decide_actuate_and_keeps_bounded_history() -> None:
    cluster = ScriptedCluster({**{f"p{i}": "prefill" for i in range(3)}, **{f"d{i}": "decode" for i in range(5)}})
    state = LoopState()
    assert state.next_due_s(PARAMS) == 0.0
    now, dues = 0.0, []
    for _ in range(6):
        d = run_once(cluster, PARAMS, state, now, history_limit=3)
        state = d.state
        assert d.next_due_s == state.next_due_s(PARAMS)
        dues.append(d.next_due_s - now)
        now = d.next_due_s
    assert sum(1 for r in cluster.roles.values() if r == "decode") == 6
    assert [d.action for d in cluster.applied][:3] == ["Hold", "Drain", "FlipToDecode"]
    assert len(state.history) <= 3
    # while a flip is pending the loop polls faster than its period
    assert cluster.applied[1].action == "Drain"
    assert dues[0] == PARAMS.period_s and dues[1] == PARAMS.drain_poll_s


def test_override_pins_the_split_step_by_step_through_drains() -> None:
    params = RolePolicyParams(override_prefill=5, step_size=1)
    d = decide_roles(RoleState(), obs(), params, INPUTS, T, 0.0)
    assert d.action == "Drain" and d.drain[0].startswith("d") and "manual override" in d.reason
    d2 = decide_roles(d.state, obs(draining={d.drain[0]}), params, INPUTS, T, 5.0)
    assert d2.action == "FlipToPrefill" and (d2.prefill_to, d2.decode_to) == (4, 4)
    d3 = decide_roles(d2.state, obs(5, 3), params, INPUTS, T, 10.0)
    assert d3.action == "Hold" and "in place" in d3.reason


def test_threshold_override_is_published_as_t_min() -> None:
    d = decide_roles(RoleState(), obs(), RolePolicyParams(override_threshold=50_000), INPUTS, T, 0.0)
    assert d.threshold_min_tokens == 50_000


def test_dry_run_loop_records_but_never_acts() -> None:
    cluster = ScriptedCluster({**{f"p{i}": "prefill" for i in range(3)}, **{f"d{i}": "decode" for i in range(5)}})
    params = RolePolicyParams(hysteresis_cycles=1, dry_run=True)
    state = LoopState()
    for i in range(4):
        effects = run_once(cluster, params, state, i * 60.0)
        state = effects.state
    assert cluster.applied == []
    assert effects.roles is not None and effects.roles.action == "Drain" and state.roles.pending is None
    assert not effects.act and effects.record is not None
    assert effects.record.reason.startswith("dry-run, not acted on: ")
    assert sum(1 for r in cluster.roles.values() if r == "prefill") == 3


def test_a_queue_does_not_flip_a_stage_below_the_observed_arrival_rate() -> None:
    # prefill queues at 3 req/s, but 4 decode instances carry only 4 x 0.78 = 3.1 req/s: one fewer would not do
    o = RoleObservation(instances(4, 4), StageLoad(60), StageLoad(0), arrival_rate_rps=3.0)
    d = decide_roles(RoleState(verdict="prefill-bound", streak=5), o, PARAMS, INPUTS, T, 0.0)
    assert d.action == "Hold" and "one decode instance fewer carries" in d.reason
    # at 2 req/s it may
    o2 = RoleObservation(instances(4, 4), StageLoad(60), StageLoad(0), arrival_rate_rps=2.0)
    assert decide_roles(RoleState(verdict="prefill-bound", streak=5), o2, PARAMS, INPUTS, T, 0.0).action == "Drain"


def test_a_statefulset_drains_its_highest_ordinal_the_pod_its_scale_down_removes() -> None:
    def sts_obs(busy: dict[str, int]) -> RoleObservation:
        insts = [InstanceState(f"prefill-{i}", "prefill", busy.get(f"prefill-{i}", 0)) for i in (0, 1, 2, 10)]
        insts += [InstanceState(f"decode-{i}", "decode") for i in range(5)]
        return RoleObservation(tuple(insts), decode=StageLoad(40))

    busy = {"prefill-0": 3, "prefill-1": 0, "prefill-2": 1, "prefill-10": 5}
    s = RoleState(verdict="decode-bound", streak=5)
    plain = decide_roles(s, sts_obs(busy), PARAMS, INPUTS, T, 0.0)
    assert plain.drain == ("prefill-1",)  # a Deployment: the least busy (pod-deletion-cost removes it)
    ordinal = RolePolicyParams(**{**PARAMS.__dict__, "ordinal_roles": frozenset({"prefill"})})
    d = decide_roles(s, sts_obs(busy), ordinal, INPUTS, T, 0.0)
    assert d.action == "Drain" and d.drain == ("prefill-10",)  # ordinal 10, not "prefill-2" by name


def test_ordinal_roles_come_from_scale_mode_statefulset_workloads() -> None:
    from pathlib import Path

    import yaml

    from prfaas_core.api import PDCluster

    doc = yaml.safe_load((Path(__file__).parents[2] / "examples/01-two-region/region-b/pd-cluster.yaml").read_text())
    spec = doc["spec"]
    assert RolePolicyParams.from_spec(PDCluster.model_validate(doc).spec).ordinal_roles == frozenset()
    spec["roleAssignment"] = {"mode": "Scale"}
    spec["workloads"] = {
        "prefill": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "pd-prefill"},
        "decode": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "pd-decode"},
    }
    assert RolePolicyParams.from_spec(PDCluster.model_validate(doc).spec).ordinal_roles == frozenset({"prefill"})
