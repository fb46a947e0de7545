"""A PDCluster's status, composed from the core's decision: counts per role, the ``t`` in force and its
bounds, the decision and its history, the loop's memory, printer columns and conditions.

Nothing here decides: the desired counts, ``t`` and its bounds, the record and the history all come from
the :class:`~prfaas_core.policy.long_term.LoopDecision`; this module only lays them out as
:class:`~prfaas_core.api.PDClusterStatus`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prfaas_core.api import Condition, PDClusterStatus
from prfaas_core.api.common import LoopMemory, PDClusterSummary, RoleStatus
from prfaas_core.policy.long_term import LoopDecision, controls_in_force
from prfaas_core.policy.role_types import Role, RolePolicyParams

from .kube import JsonDict
from .pods import counts
from .status import format_tokens, set_condition


@dataclass(frozen=True)
class Observed:
    """What the status reports besides the decision: the pods after the effects, the workloads' replica
    counts (Scale mode), the router ConfigMap, the first link's utilisation."""

    pods: list[JsonDict]
    scaled: tuple[int, int] | None
    router_config_map: str | None
    link_utilization: str


def role_status(pods: list[JsonDict], role: Role, desired: int) -> RoleStatus:
    current, ready, draining = counts(pods, role)
    return RoleStatus(current=current, desired=desired, ready=ready, draining=draining)


def cycle_conditions(
    conds: Sequence[Condition], decision: LoopDecision, params: RolePolicyParams, now_s: float, gen: int | None
) -> list[Condition]:
    """Progressing (a drain in progress), Degraded (metrics answered), Overridden (SRE controls in force)."""
    draining = decision.draining
    out = set_condition(
        conds,
        "Progressing",
        draining,
        "Draining" if draining else "Steady",
        decision.reason if draining else "no flip in progress",
        now_s,
        gen,
    )
    out = set_condition(out, "Degraded", False, "MetricsAvailable", "Prometheus answered this cycle", now_s, gen)
    controls = controls_in_force(params)
    return set_condition(
        out,
        "Overridden",
        bool(controls),
        "OperatorControls" if controls else "None",
        ", ".join(controls) or "no SRE control in force",
        now_s,
        gen,
    )


def compose(
    decision: LoopDecision,
    params: RolePolicyParams,
    observed: Observed,
    conds: Sequence[Condition],
    now_s: float,
    gen: int | None,
) -> PDClusterStatus:
    """The whole status after a cycle that decided something."""
    desired_p, desired_d = decision.desired(len(observed.pods), observed.scaled)
    prefill = role_status(observed.pods, "prefill", desired_p)
    decode = role_status(observed.pods, "decode", desired_d)
    roles = decision.state.roles
    return PDClusterStatus(
        observed_generation=gen,
        prefill=prefill,
        decode=decode,
        threshold_tokens=decision.threshold_tokens,
        threshold_min_tokens=decision.published_min_tokens,
        threshold_max_tokens=decision.bounds.max_tokens,
        last_decision=decision.record,
        decisions=list(decision.state.history),
        router_config_map=observed.router_config_map,
        # the streak matters up to the hysteresis (a verdict held longer, blocked by a bound or the cooldown,
        # would otherwise rewrite the status every cycle)
        loop=LoopMemory(verdict=roles.verdict, streak=min(roles.streak, params.hysteresis_cycles)),
        summary=PDClusterSummary(
            prefill=f"{prefill.ready}/{prefill.desired}",
            decode=f"{decode.ready}/{decode.desired}",
            threshold=format_tokens(decision.threshold_tokens),
            link=observed.link_utilization,
        ),
        conditions=cycle_conditions(conds, decision, params, now_s, gen),
    )
