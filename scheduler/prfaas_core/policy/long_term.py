"""The long-term loop as one pure step: a tick's input in, the cycle's effects out, reason attached.

The shape is Dynamo's planner (``TickInput`` -> ``PlannerEffects``): :func:`step` takes what a shell gathered
this cycle (a :class:`LoopTick`: the observation, the state the loop persisted last time, the policy with its
SRE controls — dry-run, suspend, the pinned split and the pinned ``t`` — and the links measured scarce) and
returns a :class:`LoopDecision`: the new role counts with their reason, the instances to assign, drain or
flip, ``t_min``, the ``t`` in force and the bounds to publish, the decision record, and the next state to
persist (hysteresis, cooldown, pending drain, history) with when to run again. The operator, ``prfaas up``
and the simulator each gather a tick, call :func:`step`, carry out the effects (when ``act``) and keep
``state`` — none of them decides anything itself.

A cycle is one of three kinds:

* **initial roles** (``unassigned``: Relabel mode, instances without a role): the pinned split,
  ``roleAssignment.initialPrefill``, or the planner's split; needs no metrics (the instances serve nothing);
* **no observation** (``observation is None``: no metrics this cycle): nothing is decided; the last bounds are
  published again and the loop retries after a period;
* **a decision** (:func:`~prfaas_core.policy.roles.decide_roles`), after which ``t_min`` is re-optimised.

If carrying out the effects fails, the shell keeps the old state and runs again at :meth:`LoopDecision.retry_s`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..api.common import DecisionRecord, rfc3339
from ..capacity.plan_inputs import PlanInputs
from ..capacity.planner import BalancedThresholds, compute_balanced_threshold, plan
from .link_state import LinkParams
from .role_types import Role, RoleDecision, RoleObservation, RolePolicyParams, RoleState
from .roles import Balanced, decide_roles
from .threshold import ThresholdBounds, bandwidth_floor_tokens, published_bounds, threshold_in_force

DRY_RUN_PREFIX = "dry-run, not acted on: "
REASON_MAX = 1024
QUIET_ACTIONS = ("Hold", "Suspended")
"""Actions that change nothing: no Event, no dry-run prefix."""
_FIGURE = re.compile(r"(?<![\w.-])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
"""A figure in a reason: a number standing alone (not part of a name such as ``pd-e1``)."""


@dataclass(frozen=True)
class LoopState:
    """What the loop persists between cycles (the operator in PDCluster.status and on the pods)."""

    roles: RoleState = field(default_factory=RoleState)
    """Verdict and streak (hysteresis), last flip (cooldown), the pending drain, the last ``t_min``."""
    threshold_tokens: int | None = None
    """The ``t`` in force last published (the verdict's ``t`` when the routers' own is not known)."""
    history: tuple[DecisionRecord, ...] = ()
    """The decision history (a Hold only when its reason changed), oldest first."""
    last_run_s: float | None = None

    def next_due_s(self, params: RolePolicyParams) -> float:
        """A period after the last run, a drain poll while a flip is pending; 0 before the first run."""
        if self.last_run_s is None:
            return 0.0
        return self.last_run_s + (params.drain_poll_s if self.roles.pending is not None else params.period_s)


@dataclass(frozen=True)
class ScarceLink:
    """A link last measured scarce: its bandwidth floor raises the ``t`` in force."""

    params: LinkParams
    egress_gbps: float


@dataclass(frozen=True)
class LoopTick:
    """One cycle's input."""

    now_s: float
    params: RolePolicyParams
    inputs: PlanInputs
    state: LoopState
    observation: RoleObservation | None
    """This cycle's observation (None: no metrics; with ``unassigned``, only the instances' roles count)."""
    threshold_tokens: float | None = None
    """The ``t`` the routers use now, where the shell knows it (None: the last published one, or Eq. 7)."""
    unassigned: tuple[str, ...] = ()
    """Relabel mode: instances without a role yet (they get their first role this cycle)."""
    initial_prefill: int | None = None
    """``roleAssignment.initialPrefill``: the first split, when not pinned."""
    scarce_links: tuple[ScarceLink, ...] = ()
    history_limit: int = 20
    thresholds: BalancedThresholds | None = field(default=None, compare=False, repr=False)
    """The shell's memo of Eq. 7 for this cluster (the operator keeps one per PD cluster): the same answers as
    :func:`compute_balanced_threshold`, reused while the inputs do not move. None: computed every time."""

    @property
    def balanced(self) -> Balanced:
        """How this tick answers Eq. 7: the shell's memo, else :func:`compute_balanced_threshold`."""
        return self.thresholds if self.thresholds is not None else compute_balanced_threshold


@dataclass(frozen=True)
class LoopDecision:
    """One cycle's effects. The shell carries out ``assign``/``roles.drain``/``roles.flip`` when ``act``,
    publishes ``bounds``, writes ``record`` and keeps ``state``."""

    roles: RoleDecision | None
    """What was decided (None: no observation, nothing decided)."""
    act: bool
    """Carry out the role effects (False under dry-run, or when nothing was decided)."""
    dry_run: bool
    assign: tuple[tuple[str, Role], ...]
    """First roles for unassigned instances (no drain: they serve nothing yet)."""
    threshold_min_tokens: int | None
    """``t_min`` (Eq. 7) for the new counts."""
    threshold_tokens: int | None
    """The ``t`` in force: ``t_min`` raised to the scarce links' floors, or the pin."""
    bounds: ThresholdBounds
    """The bounds published to the routers."""
    published_min_tokens: int | None
    """The lower bound as status shows it: the pin, else ``t_min`` (None before ``t_min`` is known)."""
    record: DecisionRecord | None
    recorded: bool
    """Whether ``record`` entered the history."""
    announce: bool
    """Whether the decision deserves an Event (it acts, and is not a dry-run repeat of the last one)."""
    state: LoopState
    next_due_s: float
    polling: bool
    """``next_due_s`` is a drain poll, not a period away."""
    override_prefill: int | None = None

    @property
    def reason(self) -> str:
        return self.record.reason if self.record is not None else ""

    @property
    def draining(self) -> bool:
        """A flip is in progress (a drain the shell carried out)."""
        return self.roles is not None and self.roles.state.pending is not None and not self.dry_run

    def desired(self, n_instances: int, scaled: tuple[int, int] | None = None) -> tuple[int, int]:
        """The (prefill, decode) counts the policy wants: the counts after the flip in progress, else (Scale
        mode) what the two workloads ask for — ``scaled``, read after the effects — else the decision's; the
        pinned split over everything. ``n_instances``: the instances there are now."""
        assert self.roles is not None
        d = self.roles
        p, q = d.prefill_to, d.decode_to
        pending = d.state.pending
        if pending is not None and not self.dry_run:
            k = len(pending.instances)
            p, q = (
                (d.prefill_from - k, d.decode_from + k)
                if pending.direction == "FlipToDecode"
                else (d.prefill_from + k, d.decode_from - k)
            )
        elif scaled is not None and not self.dry_run:
            p, q = scaled
        if self.override_prefill is not None:
            p, q = self.override_prefill, n_instances - self.override_prefill
        return max(p, 0), max(q, 0)

    def retry_s(self, params: RolePolicyParams) -> float:
        """When to run again after the effects failed (the old state is kept)."""
        assert self.state.last_run_s is not None
        return self.state.last_run_s + params.drain_poll_s


def controls_in_force(params: RolePolicyParams) -> list[str]:
    """The SRE controls in force, as the spec names them (for the Overridden condition)."""
    out = []
    if params.dry_run:
        out.append("policy.dryRun")
    if params.suspend:
        out.append("policy.suspend")
    if params.override_prefill is not None:
        out.append(f"overrides.prefillInstances={params.override_prefill}")
    if params.override_threshold is not None:
        out.append(f"overrides.thresholdTokens={params.override_threshold}")
    return out


def verdict_threshold(tick: LoopTick) -> float:
    """The ``t`` the verdict is judged at: the pin, the routers' ``t``, the last published ``t`` in force or
    ``t_min``, or Eq. 7 for the current prefill count."""
    params, state = tick.params, tick.state
    if params.override_threshold is not None:
        return float(params.override_threshold)
    if tick.threshold_tokens is not None:
        return float(tick.threshold_tokens)
    for t in (state.threshold_tokens, state.roles.threshold_min_tokens):
        if t is not None and t > 0:
            return float(t)
    n_p = tick.observation.count("prefill") if tick.observation is not None else 0
    t_eq7 = tick.balanced(tick.inputs, n_p)
    return float(t_eq7) if t_eq7 is not None else float(tick.inputs.lengths.support()[1])


def initial_roles(tick: LoopTick) -> RoleDecision:
    """Relabel mode, instances without a role: the pinned split, initialPrefill, or the planner's split."""
    params, obs = tick.params, tick.observation
    assert obs is not None
    have_p, have_d = obs.count("prefill"), obs.count("decode")
    n = len(obs.instances) + len(tick.unassigned)
    if params.override_prefill is not None:
        target, why = params.override_prefill, "overrides.prefillInstances"
    elif tick.initial_prefill is not None:
        target, why = tick.initial_prefill, "roleAssignment.initialPrefill"
    else:
        target, why = plan(tick.inputs).prfaas_pd.point.n_prefill, "the planner's split"
    target = max(params.prefill_min, min(params.prefill_max, target, n - params.decode_min))
    flip: list[tuple[str, Role]] = []
    n_p = have_p
    for name in tick.unassigned:
        role: Role = "prefill" if n_p < target else "decode"
        n_p += role == "prefill"
        flip.append((name, role))
    t_min = tick.balanced(tick.inputs, n_p)
    reason = (
        f"initial role assignment ({why}): {len(tick.unassigned)} unlabelled instance(s) -> "
        f"{n_p} prefill, {n - n_p} decode"
    )
    state = RoleState(threshold_min_tokens=t_min)
    return RoleDecision(
        "Rebalance", reason, have_p, have_d, n_p, n - n_p, state, flip=tuple(flip), threshold_min_tokens=t_min
    )


def _floors(tick: LoopTick) -> list[int]:
    """The scarce links' floors, at the ``t`` their measured egress was produced under (the last published
    lower bound)."""
    t = tick.state.roles.threshold_min_tokens or 0
    return [
        bandwidth_floor_tokens(tick.inputs, float(t), link.egress_gbps, link.params, "scarce")
        for link in tick.scarce_links
    ]


def _record(tick: LoopTick, d: RoleDecision, t_in_force: int | None) -> DecisionRecord:
    reason = d.reason[:REASON_MAX]
    if tick.params.dry_run and d.action not in QUIET_ACTIONS:
        reason = (DRY_RUN_PREFIX + reason)[:REASON_MAX]
    return DecisionRecord(
        time=rfc3339(tick.now_s),
        action=d.action,
        reason=reason,
        prefill_from=d.prefill_from,
        decode_from=d.decode_from,
        prefill_to=d.prefill_to,
        decode_to=d.decode_to,
        threshold_tokens=t_in_force,
    )


def wording(reason: str) -> str:
    """A reason with its figures masked (``queues: PD-P #, ...``): what a repeated Hold is compared by. A Hold's
    figures (queues, model ratios, seconds since the last flip) move every cycle at rest; its words say
    whether anything happened."""
    return _FIGURE.sub("#", reason)


def append_history(
    history: Sequence[DecisionRecord], record: DecisionRecord, limit: int
) -> tuple[tuple[DecisionRecord, ...], bool]:
    """The history rule: a Hold is recorded only when its reason differs from the last entry's in words, not
    only in figures (:func:`wording`)."""
    if history and record.action == "Hold" and wording(history[-1].reason) == wording(record.reason):
        return tuple(history), False
    return tuple([*history, record][-limit:]), True


def step(tick: LoopTick) -> LoopDecision:
    """One cycle of the long-term loop (see the module docstring). Pure: no I/O, time is ``tick.now_s``."""
    params, state, now_s = tick.params, tick.state, tick.now_s
    override_t = params.override_threshold
    persisted_t_min = state.roles.threshold_min_tokens
    if tick.observation is None:
        return LoopDecision(
            roles=None,
            act=False,
            dry_run=params.dry_run,
            assign=(),
            threshold_min_tokens=persisted_t_min,
            threshold_tokens=threshold_in_force(persisted_t_min, _floors(tick), override_t),
            bounds=published_bounds(persisted_t_min, override_t),
            published_min_tokens=override_t if override_t is not None else persisted_t_min,
            record=None,
            recorded=False,
            announce=False,
            state=replace(state, last_run_s=now_s),
            next_due_s=now_s + params.period_s,
            polling=False,
            override_prefill=params.override_prefill,
        )
    if tick.unassigned:
        d = initial_roles(tick)
        roles = RoleState(state.roles.verdict, state.roles.streak, threshold_min_tokens=d.threshold_min_tokens)
        assign, next_due_s = d.flip, now_s + params.period_s
    else:
        t = verdict_threshold(tick)
        current = state.roles
        if current.threshold_min_tokens is None and t > 0:
            current = replace(current, threshold_min_tokens=int(t))
        d = decide_roles(current, tick.observation, params, tick.inputs, t, now_s, tick.balanced)
        # dry-run: recorded, not applied — nothing drains, so no flip may stay pending
        roles = replace(d.state, pending=None) if params.dry_run else d.state
        assign = ()
        next_due_s = now_s + (params.drain_poll_s if roles.pending is not None else params.period_s)
    t_min = d.threshold_min_tokens if d.threshold_min_tokens is not None else persisted_t_min
    t_in_force = threshold_in_force(t_min, _floors(tick), override_t)
    record = _record(tick, d, t_in_force)
    last = state.history[-1] if state.history else None
    history, recorded = append_history(state.history, record, tick.history_limit)
    acts = d.action not in QUIET_ACTIONS
    repeated = params.dry_run and last is not None and last.action == d.action
    return LoopDecision(
        roles=d,
        act=not params.dry_run,
        dry_run=params.dry_run,
        assign=assign,
        threshold_min_tokens=t_min,
        threshold_tokens=t_in_force,
        bounds=published_bounds(t_min, override_t),
        published_min_tokens=override_t if override_t is not None else t_min,
        record=record,
        recorded=recorded,
        announce=acts and not repeated,
        state=LoopState(roles, t_in_force, history, now_s),
        next_due_s=next_due_s,
        polling=roles.pending is not None,
        override_prefill=params.override_prefill,
    )


__all__ = [
    "DRY_RUN_PREFIX",
    "LoopDecision",
    "LoopState",
    "LoopTick",
    "ScarceLink",
    "append_history",
    "controls_in_force",
    "initial_roles",
    "step",
    "verdict_threshold",
    "wording",
]
