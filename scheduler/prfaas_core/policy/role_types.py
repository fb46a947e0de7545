"""The long-term role policy's inputs and outputs: the knobs (:class:`RolePolicyParams`, mapped once from a
PDCluster's spec or a scenario's policy), one cycle's observation (:class:`RoleObservation`), the memory kept
between cycles (:class:`RoleState`, :class:`PendingFlip`) and the decision (:class:`RoleDecision`). The policy
itself is :mod:`.roles`; :mod:`.emergency` and :mod:`.long_term` read these types too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..api.common import DecisionAction
from ..api.pd_cluster import LongTermPolicySpec, PDClusterSpec
from ..capacity.workload import LengthDistribution

ORDINAL_KINDS = frozenset({"StatefulSet", "LeaderWorkerSet"})
"""Workload kinds that remove their highest ordinal on a scale-down."""

Role = Literal["prefill", "decode"]
Verdict = Literal["decode-bound", "prefill-bound"]


@dataclass(frozen=True)
class RolePolicyParams:
    """The knobs of PDCluster.spec.policy and spec.roles, in the core's units."""

    period_s: float = 60.0
    hysteresis_cycles: int = 2
    cooldown_s: float = 300.0
    drain_timeout_s: float = 120.0
    step_size: int = 1
    flip_to_decode_ratio: float = 1.25
    flip_to_prefill_ratio: float = 0.8
    prefill_min: int = 1
    prefill_max: int = 1024
    decode_min: int = 1
    decode_max: int = 1024
    queue_per_instance: float = 2.0
    drain_poll_s: float = 5.0
    suspend: bool = False
    dry_run: bool = False
    """Decide and record, act on nothing (the loop skips the actuator and forgets pending drains)."""
    override_prefill: int | None = None
    """Pinned prefill count: the loop drains and flips toward it, step by step, and decides nothing else."""
    override_threshold: int | None = None
    """Pinned ``t``: published as both bounds, so routers stop adapting it."""
    ordinal_roles: frozenset[str] = frozenset()
    """Roles whose workload removes its highest ordinal on a scale-down (a StatefulSet, a LeaderWorkerSet, in
    Scale mode): the drain picks that instance, since it is the one the scale-down will remove."""

    @classmethod
    def from_policy(cls, p: LongTermPolicySpec, **rest: Any) -> RolePolicyParams:
        """The knobs of a ``LongTermPolicySpec`` (a PDCluster's ``spec.policy``, a scenario's
        ``policy.roles``) mapped once; ``rest``: the bounds and whatever else the caller sets."""
        return cls(
            period_s=float(p.period_seconds),
            hysteresis_cycles=p.hysteresis_cycles,
            cooldown_s=float(p.cooldown_seconds),
            drain_timeout_s=float(p.drain_timeout_seconds),
            step_size=p.step_size,
            flip_to_decode_ratio=p.flip_to_decode_ratio,
            flip_to_prefill_ratio=p.flip_to_prefill_ratio,
            suspend=p.suspend,
            **rest,
        )

    @classmethod
    def from_spec(cls, spec: PDClusterSpec) -> RolePolicyParams:
        p = spec.policy
        return cls.from_policy(
            p,
            drain_poll_s=min(5.0, float(p.period_seconds)),
            prefill_min=spec.roles.prefill.min,
            prefill_max=spec.roles.prefill.max,
            decode_min=spec.roles.decode.min,
            decode_max=spec.roles.decode.max,
            dry_run=p.dry_run,
            override_prefill=spec.overrides.prefill_instances,
            override_threshold=spec.overrides.threshold_tokens,
            ordinal_roles=frozenset(
                role
                for role, ref in (("prefill", spec.workloads.prefill), ("decode", spec.workloads.decode))
                if spec.role_assignment.mode == "Scale" and ref is not None and ref.kind in ORDINAL_KINDS
            ),
        )


@dataclass(frozen=True)
class InstanceState:
    """One PD instance as observed: its role label, work in flight, whether it drains."""

    name: str
    role: Role
    in_flight: int = 0
    draining: bool = False
    healthy: bool = True
    """Answering (its pod Ready, its engine reachable); see :mod:`.emergency`."""


@dataclass(frozen=True)
class StageLoad:
    queue_depth: float = 0.0
    utilization: float = 0.0


@dataclass(frozen=True)
class RoleObservation:
    """What one cycle observed (the operator from Prometheus, the simulator from its queues)."""

    instances: tuple[InstanceState, ...]
    prefill: StageLoad = StageLoad()
    decode: StageLoad = StageLoad()
    prfaas: StageLoad = StageLoad()
    n_prfaas_ready: int | None = None
    lengths: LengthDistribution | None = None
    """Observed uncached-length mix (None: the declared workload)."""
    output_tokens: float | None = None
    arrival_rate_rps: float | None = None

    def count(self, role: Role) -> int:
        return sum(1 for i in self.instances if i.role == role)


@dataclass(frozen=True)
class PendingFlip:
    direction: Literal["FlipToDecode", "FlipToPrefill"]
    instances: tuple[str, ...]
    drain_started_s: float
    reason: str


@dataclass(frozen=True)
class RoleState:
    """Memory between cycles (kept by the loop; written to status by the shells)."""

    verdict: Verdict | None = None
    streak: int = 0
    last_flip_s: float | None = None
    pending: PendingFlip | None = None
    threshold_min_tokens: int | None = None


@dataclass(frozen=True)
class RoleDecision:
    """Inputs in, effects out, reason attached."""

    action: DecisionAction
    reason: str
    prefill_from: int
    decode_from: int
    prefill_to: int
    decode_to: int
    state: RoleState
    drain: tuple[str, ...] = ()
    """Instances to start draining (routers stop sending them new work)."""
    flip: tuple[tuple[str, Role], ...] = ()
    """Instances to give a new role now (and stop draining)."""
    threshold_min_tokens: int | None = None
    ratio: float | None = None
    undrain: tuple[str, ...] = ()
    """Instances to stop draining in their current role (a flip aborted at its drain timeout)."""
