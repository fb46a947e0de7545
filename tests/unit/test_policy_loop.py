"""The long-term loop's one step: tick in, effects out — initial roles, no observation, the t in force and its
bounds, the desired counts, dry-run, the history rule, the bandwidth floor."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from prfaas_core.capacity.plan_inputs import case_study_inputs
from prfaas_core.capacity.planner import BalancedThresholds, compute_balanced_threshold, plan
from prfaas_core.capacity.workload import EmpiricalDistribution, expect
from prfaas_core.names import GBPS_BITS, NO_THRESHOLD_TOKENS
from prfaas_core.policy.link_state import LinkParams
from prfaas_core.policy.long_term import DRY_RUN_PREFIX, LoopState, LoopTick, ScarceLink, step
from prfaas_core.policy.role_types import (
    InstanceState,
    PendingFlip,
    RoleObservation,
    RolePolicyParams,
    RoleState,
    StageLoad,
)
from prfaas_core.policy.threshold import bandwidth_floor_tokens, egress_budget, published_bounds

INPUTS = case_study_inputs()
PARAMS = RolePolicyParams(hysteresis_cycles=1, cooldown_s=300, drain_timeout_s=120)
LINK = LinkParams("l", 100.0, 0.8, 0.9, 0.5)


def instances(n_p: int, n_d: int) -> tuple[InstanceState, ...]:
    return tuple(
        [InstanceState(f"p{i}", "prefill") for i in range(n_p)] + [InstanceState(f"d{i}", "decode") for i in range(n_d)]
    )


def tick(obs: RoleObservation | None, params: RolePolicyParams = PARAMS, **kw: object) -> LoopTick:
    state = kw.pop("state", LoopState(RoleState(threshold_min_tokens=19_000)))
    return LoopTick(100.0, params, INPUTS, state, obs, **kw)  # type: ignore[arg-type]


def test_initial_roles_follow_the_planner_and_publish_t_min_for_them() -> None:
    d = step(tick(RoleObservation(()), unassigned=tuple(f"pod-{i}" for i in range(8)), state=LoopState()))
    n_p = plan(INPUTS).prfaas_pd.point.n_prefill
    assert d.roles is not None and d.roles.action == "Rebalance" and "the planner's split" in d.roles.reason
    assert [r for _, r in d.assign].count("prefill") == n_p and len(d.assign) == 8
    assert d.threshold_min_tokens == compute_balanced_threshold(INPUTS, n_p) == d.bounds.min_tokens
    assert d.bounds.max_tokens == NO_THRESHOLD_TOKENS and d.act and d.recorded
    assert d.next_due_s == 100.0 + PARAMS.period_s and not d.polling


def test_initial_roles_take_initial_prefill_then_the_pin() -> None:
    obs = RoleObservation(instances(1, 0))
    d = step(tick(obs, unassigned=("a", "b", "c"), initial_prefill=2))
    assert d.roles is not None and (d.roles.prefill_to, d.roles.decode_to) == (2, 2)
    pinned = step(tick(obs, RolePolicyParams(override_prefill=3), unassigned=("a", "b", "c"), initial_prefill=2))
    assert pinned.roles is not None and pinned.roles.prefill_to == 3 and "overrides.prefillInstances" in pinned.reason


def test_no_observation_decides_nothing_and_republishes_the_last_bounds() -> None:
    state = LoopState(RoleState("decode-bound", 1, threshold_min_tokens=19_000), threshold_tokens=21_000)
    d = step(tick(None, state=state))
    assert d.roles is None and d.record is None and not d.act and not d.recorded
    assert d.bounds == published_bounds(19_000, None) and d.published_min_tokens == 19_000
    assert d.state.roles == state.roles and d.state.last_run_s == 100.0
    assert d.next_due_s == 100.0 + PARAMS.period_s


def test_scarce_links_raise_the_t_in_force_never_the_published_lower_bound() -> None:
    obs = RoleObservation(instances(3, 5), arrival_rate_rps=2.0)
    calm = step(tick(obs))
    assert calm.threshold_tokens == calm.threshold_min_tokens
    scarce = step(tick(obs, scarce_links=(ScarceLink(LINK, 75.0),)))
    floor = bandwidth_floor_tokens(INPUTS, 19_000.0, 75.0, LINK, "scarce")
    assert floor > 19_000
    assert scarce.threshold_tokens == max(floor, scarce.threshold_min_tokens or 0)
    assert scarce.bounds.min_tokens == scarce.threshold_min_tokens  # routers raise t themselves
    assert scarce.record is not None and scarce.record.threshold_tokens == scarce.threshold_tokens
    pinned = step(tick(obs, RolePolicyParams(override_threshold=50_000), scarce_links=(ScarceLink(LINK, 75.0),)))
    assert pinned.threshold_tokens == pinned.bounds.min_tokens == pinned.bounds.max_tokens == 50_000


@pytest.mark.parametrize("mode", ["scarce", "abundant"])
def test_the_bandwidth_floor_fits_the_same_budget_the_threshold_policy_uses(mode: str) -> None:
    watermark, budget = egress_budget(mode, LINK)  # type: ignore[arg-type]
    assert watermark == (LINK.abundant_watermark if mode == "scarce" else LINK.scarce_watermark)
    egress, t = 70.0, 19_000.0
    floor = bandwidth_floor_tokens(INPUTS, t, egress, LINK, mode)  # type: ignore[arg-type]

    def per_request(x: float) -> float:
        return expect(INPUTS.lengths, INPUTS.kv.curve, x, math.inf)

    rate = egress * GBPS_BITS / 8.0 / per_request(t)
    assert rate * per_request(floor) <= budget * GBPS_BITS / 8.0 * (1 + 1e-9)
    assert floor == 0 or rate * per_request(floor - 1) > budget * GBPS_BITS / 8.0
    assert bandwidth_floor_tokens(INPUTS, t, 0.0, LINK, mode) == 0  # type: ignore[arg-type]


def test_desired_counts_follow_the_drain_then_the_workloads_then_the_pin() -> None:
    obs = RoleObservation(instances(3, 5), decode=StageLoad(100))
    d = step(tick(obs))
    assert d.roles is not None and d.roles.action == "Drain" and d.draining and d.polling
    assert d.desired(8) == (2, 6)
    assert d.next_due_s == 100.0 + PARAMS.drain_poll_s
    hold = step(tick(RoleObservation(instances(3, 5))))
    assert hold.desired(8, scaled=(4, 4)) == (4, 4) and hold.desired(8) == (3, 5)
    pinned = step(tick(RoleObservation(instances(3, 5)), RolePolicyParams(override_prefill=5)))
    assert pinned.desired(8) == (5, 3)


def test_dry_run_records_with_the_prefix_announces_once_and_never_leaves_a_drain_pending() -> None:
    params = RolePolicyParams(hysteresis_cycles=1, dry_run=True)
    obs = RoleObservation(instances(3, 5), decode=StageLoad(100))
    first = step(tick(obs, params))
    assert first.roles is not None and first.roles.action == "Drain" and not first.act
    assert first.record is not None and first.record.reason.startswith(DRY_RUN_PREFIX)
    assert first.state.roles.pending is None and not first.draining and not first.polling
    assert first.desired(8) == (3, 5) and first.announce
    again = step(LoopTick(160.0, params, INPUTS, first.state, obs))
    assert again.roles is not None and again.roles.action == "Drain" and not again.announce


def test_history_keeps_a_hold_only_when_its_reason_changes_and_is_bounded() -> None:
    obs = RoleObservation(instances(3, 5))
    state = LoopState(RoleState(threshold_min_tokens=19_000))
    for i in range(3):
        d = step(LoopTick(60.0 * i, PARAMS, INPUTS, state, obs, 19_000.0, history_limit=2))
        state = d.state
        assert d.recorded == (i == 0)
    assert len(state.history) == 1
    for i in range(3):
        busy = RoleObservation(instances(3, 5), decode=StageLoad(100.0 + i))  # a new reason each cycle
        state = step(LoopTick(200.0 + i, PARAMS, INPUTS, state, busy, 19_000.0, history_limit=2)).state
    assert len(state.history) == 2 and state.history[-1].time == "1970-01-01T00:03:22Z"


def test_a_hold_that_moved_only_in_its_figures_is_not_recorded_again() -> None:
    """A Hold's figures (the queues here, the model's ratios, seconds since the last flip) move every cycle at
    rest: the history (and so the status) keeps the first; words that change are recorded."""
    params = RolePolicyParams(hysteresis_cycles=1000)  # a verdict that only holds: "(n of 1000 cycles)"
    state = LoopState(RoleState(threshold_min_tokens=19_000))
    recorded = []
    for i in range(5):
        busy = RoleObservation(instances(3, 5), decode=StageLoad(100.0 + 7 * i))
        d = step(LoopTick(60.0 * i, params, INPUTS, state, busy, 19_000.0))
        assert d.roles is not None and d.roles.action == "Hold"
        state, _ = d.state, recorded.append(d.recorded)
    assert recorded == [True, False, False, False, False] and len(state.history) == 1
    quiet = RoleObservation(instances(3, 5))
    d = step(LoopTick(400.0, params, INPUTS, state, quiet, 19_000.0))
    assert d.recorded and "no standing queue" in d.state.history[-1].reason


def test_a_pending_drain_restored_from_the_cluster_finishes() -> None:
    pending = PendingFlip("FlipToDecode", ("p0",), 0.0, "decode-bound")
    state = LoopState(RoleState(pending=pending, threshold_min_tokens=19_000))
    d = step(tick(RoleObservation(instances(3, 5)), state=state))
    assert d.roles is not None and d.roles.action == "FlipToDecode" and d.roles.flip == (("p0", "decode"),)
    assert d.state.roles.last_flip_s == 100.0 and d.state.roles.pending is None


def test_the_thresholds_memo_answers_as_eq7_does_and_recomputes_a_changed_input() -> None:
    memo = BalancedThresholds()
    observed = replace(INPUTS, lengths=EmpiricalDistribution.from_lengths([500, 4_000, 20_000, 60_000]))
    for inputs in (INPUTS, observed):
        for n_p in (0, 1, 3, 5):
            assert memo(inputs, n_p) == compute_balanced_threshold(inputs, n_p)
    assert (memo.hits, memo.misses, len(memo)) == (0, 8, 8)
    assert memo(replace(INPUTS), 3) == compute_balanced_threshold(INPUTS, 3)  # an equal copy: the answer is reused
    assert (memo.hits, memo.misses) == (1, 8)
    moved = replace(INPUTS, n_prfaas=INPUTS.n_prfaas + 2)  # a changed input: computed again
    assert memo(moved, 3) == compute_balanced_threshold(moved, 3) != compute_balanced_threshold(INPUTS, 3)
    assert memo(INPUTS, 3, 50) == compute_balanced_threshold(INPUTS, 3, 50)  # another step: computed again
    assert (memo.hits, memo.misses, len(memo)) == (1, 10, memo.size)  # bounded: the least recently used went
    assert memo(INPUTS, 3) == compute_balanced_threshold(INPUTS, 3) and memo.hits == 2  # used lately: kept
    assert memo(INPUTS, 0) is None and memo.misses == 11  # the oldest: dropped, computed again


def test_a_tick_with_the_thresholds_memo_decides_exactly_as_one_without() -> None:
    """Every path of the loop that asks Eq. 7 (first roles, the verdict's ``t`` with nothing persisted, the
    model's flips, ``t_min`` after the decision), twice over: the second round's answers come from the memo."""
    memo = BalancedThresholds()
    quiet = RoleObservation(instances(3, 5), arrival_rate_rps=2.0)
    ticks = [
        tick(RoleObservation(()), unassigned=tuple(f"pod-{i}" for i in range(8)), state=LoopState()),
        tick(quiet),
        tick(quiet, state=LoopState()),
        tick(RoleObservation(instances(5, 3), arrival_rate_rps=0.5)),
        tick(RoleObservation(instances(3, 5), decode=StageLoad(100.0), arrival_rate_rps=2.0)),
        tick(RoleObservation(instances(3, 5), n_prfaas_ready=0, arrival_rate_rps=2.0)),
    ]
    for _ in range(2):
        for t in ticks:
            assert step(replace(t, thresholds=memo)) == step(t)
    assert memo.hits >= memo.misses > 0
