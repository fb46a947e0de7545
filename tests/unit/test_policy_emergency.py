"""The loop's emergency verdict: no healthy decode (or prefill) instance flips one at once, within the bounds."""

from __future__ import annotations

from dataclasses import replace

from prfaas_core.capacity.plan_inputs import case_study_inputs
from prfaas_core.policy.role_types import InstanceState, RoleObservation, RolePolicyParams, RoleState
from prfaas_core.policy.roles import decide_roles

INPUTS = case_study_inputs()
PARAMS = RolePolicyParams(hysteresis_cycles=3, cooldown_s=300, drain_timeout_s=120, prefill_min=1, decode_min=1)
T = 19_400


def cluster(dead: set[str], busy: dict[str, int] | None = None, ready_prfaas: int | None = 1) -> RoleObservation:
    busy = busy or {}
    inst = [InstanceState(n, "prefill", busy.get(n, 0), healthy=n not in dead) for n in ("p0", "p1")]
    inst.append(InstanceState("d0", "decode", 0, healthy="d0" not in dead))
    return RoleObservation(tuple(inst), n_prfaas_ready=ready_prfaas)


def test_losing_the_only_decode_drains_a_prefill_instance_at_once_then_flips_it() -> None:
    """The outage finding: with the decode engine dead the loop flips a prefill instance, no hysteresis,
    cooldown ignored, the reason says why."""
    recent_flip = RoleState(last_flip_s=0.0)  # inside the cooldown
    d1 = decide_roles(recent_flip, cluster({"d0"}, busy={"p0": 2}), PARAMS, INPUTS, T, 10.0)
    assert d1.action == "Drain" and d1.drain == ("p1",)
    assert d1.reason.startswith("emergency: no healthy decode instance")
    o2 = RoleObservation(
        (
            InstanceState("p0", "prefill", 2),
            InstanceState("p1", "prefill", 0, draining=True),
            InstanceState("d0", "decode", 0, healthy=False),
        ),
        n_prfaas_ready=1,
    )
    d2 = decide_roles(d1.state, o2, PARAMS, INPUTS, T, 15.0)
    assert d2.action == "FlipToDecode" and d2.flip == (("p1", "decode"),) and "emergency" in d2.reason


def test_the_bounds_still_hold_in_an_emergency() -> None:
    tight = replace(PARAMS, prefill_min=2)
    d = decide_roles(RoleState(), cluster({"d0"}), tight, INPUTS, T, 10.0)
    assert d.action == "Hold" and not d.drain


def test_no_prefill_is_an_emergency_only_when_the_remote_cannot_prefill() -> None:
    inst = (
        InstanceState("p0", "prefill", 0, healthy=False),
        InstanceState("d0", "decode", 3),
        InstanceState("d1", "decode", 1),
    )
    remote_up = decide_roles(RoleState(), RoleObservation(inst, n_prfaas_ready=2), PARAMS, INPUTS, T, 0.0)
    assert remote_up.action == "Hold"
    remote_down = decide_roles(RoleState(), RoleObservation(inst, n_prfaas_ready=0), PARAMS, INPUTS, T, 0.0)
    assert remote_down.action == "Drain" and remote_down.drain == ("d1",)
    assert remote_down.reason.startswith("emergency: no healthy prefill instance")


def test_a_healthy_cluster_has_no_emergency() -> None:
    d = decide_roles(RoleState(), cluster(set()), PARAMS, INPUTS, T, 0.0)
    assert not d.reason.startswith("emergency")


def test_the_gateway_lost_shifts_the_split_toward_local_prefill() -> None:
    """The finding: with the gateway killed the loop kept Hold (the remote's capacity still counted). With no
    ready PrFaaS instance every request prefills locally: the model sees PD prefill as the bottleneck."""
    inst = tuple(
        [InstanceState(f"p{i}", "prefill") for i in range(3)] + [InstanceState(f"d{i}", "decode") for i in range(5)]
    )
    params = replace(PARAMS, hysteresis_cycles=1)
    for rate in (0.5, 2.0):
        with_remote = decide_roles(
            RoleState(), RoleObservation(inst, n_prfaas_ready=4, arrival_rate_rps=rate), params, INPUTS, T, 0.0
        )
        assert with_remote.action == "Hold"
        lost = decide_roles(
            RoleState(), RoleObservation(inst, n_prfaas_ready=0, arrival_rate_rps=rate), params, INPUTS, T, 0.0
        )
        assert lost.action == "Drain" and lost.drain and lost.drain[0].startswith("d"), lost.reason
        assert "prefill-bound" in lost.reason
