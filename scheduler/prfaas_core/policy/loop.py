"""The long-term loop: observe -> decide -> actuate -> report, on an injected clock.

The loop owns no I/O: an :class:`Observer` gathers a :class:`RoleObservation` (the operator from
Prometheus and the Kubernetes API, ``prfaas up`` from the emulated engines, the simulator from its queues),
an :class:`Actuator` applies the decision (relabel or scale, drain through the engines' admin API or the
router's draining list, publish ``t_min``). The shells decide *when* to call :meth:`LongTermLoop.run_once`
(``next_due_s`` says: every period, or every few seconds while a drain is in progress).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from ..plan_inputs import PlanInputs
from .roles import RoleDecision, RoleObservation, RolePolicyParams, RoleState, decide_roles


class Observer(Protocol):
    def observe(self, now_s: float) -> RoleObservation: ...


class Actuator(Protocol):
    def apply(self, decision: RoleDecision, now_s: float) -> None: ...


@dataclass(frozen=True)
class DecisionEntry:
    """A decision as recorded in history (and in PDCluster.status.decisions)."""

    time_s: float
    decision: RoleDecision


@dataclass
class LongTermLoop:
    """One PD cluster's long-term loop. ``threshold_tokens`` reads the ``t`` in force (e.g. from routers)."""

    params: RolePolicyParams
    inputs: PlanInputs
    observer: Observer
    actuator: Actuator
    threshold_tokens: Callable[[], float]
    state: RoleState = field(default_factory=RoleState)
    history_limit: int = 20
    history: deque[DecisionEntry] = field(init=False)
    last_run_s: float | None = None

    def __post_init__(self) -> None:
        self.history = deque(maxlen=self.history_limit)

    def run_once(self, now_s: float) -> RoleDecision:
        """One cycle. Exceptions from the observer propagate (the shell reports them and retries later);
        an actuator failure leaves the state unchanged, so the next cycle decides again from what it sees."""
        obs = self.observer.observe(now_s)
        t = self.threshold_tokens()
        if self.state.threshold_min_tokens is None and t > 0:
            self.state = RoleState(threshold_min_tokens=int(t))
        decision = decide_roles(self.state, obs, self.params, self.inputs, t, now_s)
        if self.params.dry_run:
            # recorded, not applied: nothing drains, so no flip may stay pending
            self.state = replace(decision.state, pending=None)
        else:
            self.actuator.apply(decision, now_s)
            self.state = decision.state
        self.last_run_s = now_s
        if decision.action != "Hold" or not self.history or self.history[-1].decision.reason != decision.reason:
            self.history.append(DecisionEntry(now_s, decision))
        return decision

    def next_due_s(self) -> float:
        """When to run next: a period after the last run, or a drain poll while a flip is pending."""
        if self.last_run_s is None:
            return 0.0
        step = self.params.drain_poll_s if self.state.pending is not None else self.params.period_s
        return self.last_run_s + step
