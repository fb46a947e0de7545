"""The long-term loop's emergency verdict: a PD cluster with no healthy decode instance (or no healthy prefill
instance while nothing else can prefill) serves nothing, whatever the queues say; waiting out hysteresis and
the cooldown would keep it down. So one instance of the other role (healthy, least in flight) is drained at
once for a flip, within the role bounds; the drain rules still apply to the giving side (the pending flip
completes when it is drained or at the drain timeout), and the reason says it is an emergency.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from .role_types import InstanceState, PendingFlip, Role, RoleDecision, RoleObservation, RolePolicyParams, RoleState

EMERGENCY = "emergency"
"""The first word of an emergency decision's reason."""


def _serving(i: InstanceState) -> bool:
    return i.healthy and not i.draining


def emergency(
    state: RoleState,
    obs: RoleObservation,
    params: RolePolicyParams,
    now_s: float,
    decision: Callable[..., RoleDecision],
    remote_can_prefill: bool,
) -> RoleDecision | None:
    """The emergency flip's drain, or None when there is no emergency (or the bounds forbid any flip, which
    the reason of the ordinary verdict then reports)."""
    n_p, n_d = obs.count("prefill"), obs.count("decode")
    healthy_p = [i for i in obs.instances if i.role == "prefill" and _serving(i)]
    healthy_d = [i for i in obs.instances if i.role == "decode" and _serving(i)]
    source: Role
    direction: Literal["FlipToDecode", "FlipToPrefill"]
    if not healthy_d and healthy_p:
        if n_p - 1 < params.prefill_min or n_d + 1 > params.decode_max:
            return None
        source, direction = "prefill", "FlipToDecode"
        why = f"{EMERGENCY}: no healthy decode instance (of {n_d})"
        givers = healthy_p
    elif not healthy_p and not remote_can_prefill and len(healthy_d) > 1:
        if n_d - 1 < params.decode_min or n_p + 1 > params.prefill_max:
            return None
        source, direction = "decode", "FlipToPrefill"
        why = f"{EMERGENCY}: no healthy prefill instance (of {n_p}) and no ready PrFaaS instance"
        givers = healthy_d
    else:
        return None
    pick = min(givers, key=lambda i: (i.in_flight, i.name))
    pending = PendingFlip(direction, (pick.name,), now_s, why)
    held = RoleState(None, 0, state.last_flip_s, pending, state.threshold_min_tokens)
    return decision("Drain", f"{why}: draining {pick.name} ({source}) for an immediate flip", held, drain=(pick.name,))
