"""The long-term role policy (paper §3.4.3): flip PD-cluster instances between prefill and decode.

Each cycle classifies the cluster from two signals:

* **queues** (measured): a *standing* queue is more than ``queue_per_instance`` waiting requests per
  instance of a stage. Decode queues while prefill keeps up -> decode-bound; PD-P or PrFaaS queue while
  decode keeps up -> prefill-bound; both queue -> flipping cannot help (more hardware is needed).
* **the model** (paper Eq. 8), when no queue stands: ``r = (Θ_prfaas + Θ_pd-p) / Θ_pd-d`` at the current
  counts and the *observed* length mix; ``r > flipToDecodeRatio`` -> decode-bound, ``r <
  flipToPrefillRatio`` -> prefill-bound, provided the flip raises the model's ``Λ_max``.

A verdict must persist ``hysteresisCycles`` cycles, respect the cooldown since the last flip and the
per-role bounds; then ``stepSize`` instances of the source role (least in flight first) are drained, and
flipped once drained; a drain still busy after ``drainTimeoutSeconds`` aborts the flip (nothing is cut off).
After every change — and every cycle, since the mix moves — ``t_min`` is re-optimised for the counts (Eq. 7)
and published with the decision.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Literal

from ..api.common import DecisionAction
from ..capacity.plan_inputs import PlanInputs
from ..capacity.planner import compute_balanced_threshold, evaluate, split_lengths
from ..names import NO_THRESHOLD_TOKENS
from .emergency import emergency
from .role_types import PendingFlip, Role, RoleDecision, RoleObservation, RolePolicyParams, RoleState, Verdict


def _inputs_for(base: PlanInputs, obs: RoleObservation) -> PlanInputs:
    changes: dict[str, object] = {}
    if obs.lengths is not None:
        changes["lengths"] = obs.lengths
    if obs.output_tokens is not None and obs.output_tokens > 0:
        changes["output_tokens"] = obs.output_tokens
    if obs.n_prfaas_ready is not None:
        changes["n_prfaas"] = obs.n_prfaas_ready
    return replace(base, **changes) if changes else base  # type: ignore[arg-type]  # fields vary by name


Balanced = Callable[[PlanInputs, int], int | None]
"""Eq. 7 for the inputs and a prefill count: :func:`compute_balanced_threshold`, or a caller's memo of it
(:class:`~prfaas_core.capacity.planner.BalancedThresholds`: the same answers)."""


def _t_min(
    inputs: PlanInputs, n_prefill: int, fallback: int | None, balanced: Balanced = compute_balanced_threshold
) -> int | None:
    t = balanced(inputs, n_prefill)
    return t if t is not None else fallback


def _lambda(inputs: PlanInputs, n_p: int, n_d: int, t: float) -> float:
    return evaluate(inputs, split_lengths(inputs, t), inputs.n_prfaas, n_p, n_d).throughput_rps


def classify(
    obs: RoleObservation,
    inputs: PlanInputs,
    params: RolePolicyParams,
    threshold_tokens: float,
    balanced: Balanced = compute_balanced_threshold,
) -> tuple[Verdict | None, str, float]:
    """The cycle's verdict, its reason, and the model ratio ``r`` (``balanced``: how Eq. 7 is answered)."""
    n_p, n_d = obs.count("prefill"), obs.count("decode")
    n_prfaas = inputs.n_prfaas
    if n_prfaas == 0:  # no PrFaaS instance ready (the gateway lost): every request prefills locally
        threshold_tokens = float(NO_THRESHOLD_TOKENS)
    point = evaluate(inputs, split_lengths(inputs, threshold_tokens), n_prfaas, n_p, n_d)
    producers = point.theta_prfaas + point.theta_pd_p
    ratio = producers / point.theta_pd_d if point.theta_pd_d > 0 else math.inf
    q = params.queue_per_instance
    pre_q, prf_q, dec_q = obs.prefill.queue_depth, obs.prfaas.queue_depth, obs.decode.queue_depth
    prefill_standing = pre_q > q * max(n_p, 1) or (n_prfaas > 0 and prf_q > q * n_prfaas)
    decode_standing = dec_q > q * max(n_d, 1)
    queues = f"queues: PD-P {pre_q:.0f}, PrFaaS {prf_q:.0f}, PD-D {dec_q:.0f}"
    model = f"(Θ_prfaas+Θ_pd-p)/Θ_pd-d = {producers:.2f}/{point.theta_pd_d:.2f} = {ratio:.2f}"
    if prefill_standing and decode_standing:
        return None, f"both stages queue ({queues}): flipping cannot help, more hardware is needed", ratio
    lam = obs.arrival_rate_rps
    if decode_standing:
        why = f"decode-bound: {queues} (> {q:g} per decode instance)"
        if lam is not None and n_p > 1:
            fewer = evaluate(inputs, split_lengths(inputs, threshold_tokens), n_prfaas, n_p - 1, n_d + 1)
            prefill_after = min(fewer.prfaas_rate, fewer.pd_prefill_rate)
            if prefill_after < lam:
                return (
                    None,
                    f"{why}, but one prefill instance fewer carries {prefill_after:.2f} < {lam:.2f} req/s",
                    ratio,
                )
        return "decode-bound", why, ratio
    if prefill_standing:
        why = f"prefill-bound: {queues} (> {q:g} per prefill instance)"
        if lam is not None and n_d > 1:
            decode_after = (n_d - 1) * inputs.decode_requests_per_second()
            if decode_after < lam:
                return None, f"{why}, but one decode instance fewer carries {decode_after:.2f} < {lam:.2f} req/s", ratio
        return "prefill-bound", why, ratio
    # without queues, the model (Eq. 8) may move the split ahead of load — only when the observed arrival rate
    # is known and the new split carries it with more headroom than the current one (so a model that
    # disagrees with what the engines measure never flips against them)
    if lam is None:
        return None, f"no standing queue; {model} (arrival rate unknown: the model alone flips nothing)", ratio
    t_now = threshold_tokens
    if ratio > params.flip_to_decode_ratio:
        lean = f"{model} > {params.flip_to_decode_ratio:g} leans decode-bound"
        if n_p <= 1:
            return None, f"no standing queue; {lean}, but prefill is at one instance", ratio
        after = _lambda(inputs, n_p - 1, n_d + 1, _t_min(inputs, n_p - 1, None, balanced) or t_now)
        if after > point.throughput_rps and after >= lam:
            return "decode-bound", f"decode-bound by the model: {model} > {params.flip_to_decode_ratio:g}", ratio
        return None, _not_worth(lean, "prefill", "decode", point.throughput_rps, after, lam), ratio
    if ratio < params.flip_to_prefill_ratio:
        lean = f"{model} < {params.flip_to_prefill_ratio:g} leans prefill-bound"
        if n_d <= 1:
            return None, f"no standing queue; {lean}, but decode is at one instance", ratio
        t_after = t_now if n_prfaas == 0 else (_t_min(inputs, n_p + 1, None, balanced) or t_now)
        after = _lambda(inputs, n_p + 1, n_d - 1, t_after)
        # with the remote lost, a flip that raises what the cluster carries helps even if it cannot carry it all
        if after > point.throughput_rps and (after >= lam or n_prfaas == 0):
            return "prefill-bound", f"prefill-bound by the model: {model} < {params.flip_to_prefill_ratio:g}", ratio
        return None, _not_worth(lean, "decode", "prefill", point.throughput_rps, after, lam), ratio
    band = f"[{params.flip_to_prefill_ratio:g}, {params.flip_to_decode_ratio:g}]"
    return None, f"balanced: {model} within {band}, no standing queue", ratio


def _not_worth(lean: str, source: str, target: str, now_rps: float, after_rps: float, lam: float) -> str:
    """Why the model's lean flips nothing: the flip would not raise Λ_max, or would not carry the load."""
    why = (
        f"flipping a {source} instance to {target} would lower Λ_max ({now_rps:.2f} -> {after_rps:.2f} req/s)"
        if after_rps <= now_rps
        else f"Λ_max after a flip ({after_rps:.2f} req/s) would not carry the {lam:.2f} req/s arriving"
    )
    return f"no standing queue; {lean}, but {why}: holding"


def _ordinal(name: str) -> int:
    """A StatefulSet (or LeaderWorkerSet leader) pod's ordinal: its name's trailing ``-N`` (-1 if none)."""
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def _pick(obs: RoleObservation, role: Role, k: int, params: RolePolicyParams | None = None) -> tuple[str, ...]:
    """The ``k`` instances of ``role`` to drain: the least busy, or, where the workload scales down by ordinal,
    the highest ordinals (the pods the scale-down will remove)."""
    free = [i for i in obs.instances if i.role == role and not i.draining]
    if params is not None and role in params.ordinal_roles:
        candidates = sorted(free, key=lambda i: (-_ordinal(i.name), i.name))
    else:
        candidates = sorted(free, key=lambda i: (i.in_flight, i.name))
    return tuple(i.name for i in candidates[:k])


Decide = Callable[..., RoleDecision]
"""Builds the cycle's decision from an action, reason and next state (``t_min`` re-optimised for the counts)."""


def decide_roles(
    state: RoleState,
    obs: RoleObservation,
    params: RolePolicyParams,
    base_inputs: PlanInputs,
    threshold_tokens: float,
    now_s: float,
    balanced: Balanced = compute_balanced_threshold,
) -> RoleDecision:
    """One cycle of the long-term policy. Pure: the next state travels inside the decision. In order: a
    suspended policy observes only; a pending flip finishes its drain (:func:`_finish_drain`); a pinned split
    is approached (:func:`_toward_override`); else the verdict may start a drain (:func:`_from_verdict`).
    ``balanced`` answers Eq. 7 (a caller's memo of :func:`compute_balanced_threshold` gives the same answers)."""
    inputs = _inputs_for(base_inputs, obs)
    n_p, n_d = obs.count("prefill"), obs.count("decode")

    def decision(
        action: DecisionAction,
        reason: str,
        new_state: RoleState,
        p_to: int = n_p,
        d_to: int = n_d,
        ratio: float | None = None,
        drain: tuple[str, ...] = (),
        flip: tuple[tuple[str, Role], ...] = (),
        undrain: tuple[str, ...] = (),
    ) -> RoleDecision:
        if params.override_threshold is not None:
            t_min: int | None = params.override_threshold
        else:
            t_min = _t_min(inputs, p_to, state.threshold_min_tokens, balanced)
        new_state = replace(new_state, threshold_min_tokens=t_min)
        return RoleDecision(
            action,
            reason,
            n_p,
            n_d,
            p_to,
            d_to,
            new_state,
            drain,
            flip,
            threshold_min_tokens=t_min,
            ratio=ratio,
            undrain=undrain,
        )

    if params.suspend:
        return decision("Suspended", "policy.suspend is true: observing only, no flips", replace(state, pending=None))
    if state.pending is not None:
        return _finish_drain(state, state.pending, obs, params, now_s, decision)
    if params.override_prefill is not None:
        return _toward_override(params.override_prefill, obs, params, now_s, n_p, decision)

    remote_ok = obs.n_prfaas_ready is not None and obs.n_prfaas_ready > 0
    urgent = emergency(state, obs, params, now_s, decision, remote_ok)
    if urgent is not None:
        return urgent
    return _from_verdict(state, obs, params, inputs, threshold_tokens, now_s, decision, balanced)


def _finish_drain(
    state: RoleState,
    pending: PendingFlip,
    obs: RoleObservation,
    params: RolePolicyParams,
    now_s: float,
    decision: Decide,
) -> RoleDecision:
    """A flip in progress: keep draining, or flip once drained. At the drain timeout with requests still in
    flight the flip is aborted, never forced: the instances stop draining and serve on in their role (as
    ``kubectl drain --timeout`` gives up rather than cut the pods' work short), the reason says so, and the
    verdict starts over (hysteresis again before the next drain)."""
    n_p, n_d = obs.count("prefill"), obs.count("decode")
    by_name = {i.name: i for i in obs.instances}
    from_role: Role = "prefill" if pending.direction == "FlipToDecode" else "decode"
    target: Role = "decode" if from_role == "prefill" else "prefill"
    present = [by_name[n] for n in pending.instances if n in by_name and by_name[n].role == from_role]
    if not present:
        return decision(
            "Hold",
            "pending flip abandoned: its instances are gone or already flipped",
            replace(state, pending=None),
        )
    in_flight = sum(i.in_flight for i in present)
    waited = now_s - pending.drain_started_s
    if in_flight > 0 and waited < params.drain_timeout_s:
        return decision(
            "Drain",
            f"draining {', '.join(i.name for i in present)}: {in_flight} in flight "
            f"({waited:.0f} s of {params.drain_timeout_s:.0f} s)",
            state,
        )
    names = ", ".join(i.name for i in present)
    if in_flight > 0:
        return decision(
            "Hold",
            f"{pending.reason}; drain timeout after {waited:.0f} s with {in_flight} in flight: flip aborted, "
            f"{names} back in service as {from_role} (no request cut off)",
            RoleState(None, 0, state.last_flip_s, None, state.threshold_min_tokens),
            undrain=tuple(i.name for i in present),
        )
    how = "drained"
    k = len(present)
    p_to, d_to = (n_p - k, n_d + k) if target == "decode" else (n_p + k, n_d - k)
    flip = tuple((i.name, target) for i in present)
    return decision(
        pending.direction,
        f"{pending.reason}; {how}: {names} -> {target}",
        RoleState(None, 0, now_s, None, state.threshold_min_tokens),
        p_to,
        d_to,
        flip=flip,
    )


def _from_verdict(
    state: RoleState,
    obs: RoleObservation,
    params: RolePolicyParams,
    inputs: PlanInputs,
    threshold_tokens: float,
    now_s: float,
    decision: Decide,
    balanced: Balanced = compute_balanced_threshold,
) -> RoleDecision:
    """The verdict, after hysteresis, cooldown and the per-role bounds: hold, or drain ``stepSize`` instances."""
    n_p, n_d = obs.count("prefill"), obs.count("decode")
    verdict, why, ratio = classify(obs, inputs, params, threshold_tokens, balanced)
    streak = state.streak + 1 if verdict is not None and verdict == state.verdict else (1 if verdict else 0)
    held = RoleState(verdict, streak, state.last_flip_s, None, state.threshold_min_tokens)
    if verdict is None:
        return decision("Hold", why, held, ratio=ratio)
    if streak < params.hysteresis_cycles:
        return decision("Hold", f"{why} ({streak} of {params.hysteresis_cycles} cycles)", held, ratio=ratio)
    if state.last_flip_s is not None and now_s - state.last_flip_s < params.cooldown_s:
        since = now_s - state.last_flip_s
        return decision(
            "Hold", f"{why}; cooldown: last flip {since:.0f} s ago < {params.cooldown_s:.0f} s", held, ratio=ratio
        )
    source: Role
    direction: Literal["FlipToDecode", "FlipToPrefill"]
    if verdict == "decode-bound":
        k = min(params.step_size, n_p - params.prefill_min, params.decode_max - n_d)
        source, direction, bound = "prefill", "FlipToDecode", "prefill at its minimum or decode at its maximum"
    else:
        k = min(params.step_size, n_d - params.decode_min, params.prefill_max - n_p)
        source, direction, bound = "decode", "FlipToPrefill", "decode at its minimum or prefill at its maximum"
    if k <= 0:
        return decision("Hold", f"{why}; {bound}", held, ratio=ratio)
    names = _pick(obs, source, k, params)
    if not names:
        return decision("Hold", f"{why}; no {source} instance free to drain", held, ratio=ratio)
    reason = f"{why} for {streak} cycles"
    new_pending = PendingFlip(direction, names, now_s, reason)
    return decision(
        "Drain",
        f"{reason}: draining {', '.join(names)} before the flip",
        replace(held, pending=new_pending),
        ratio=ratio,
        drain=names,
    )


def _toward_override(
    target_p: int,
    obs: RoleObservation,
    params: RolePolicyParams,
    now_s: float,
    n_p: int,
    decision: Decide,
) -> RoleDecision:
    """A pinned split: drain ``stepSize`` instances toward it each step (drain still applies)."""
    pinned = f"manual override: prefill pinned to {target_p}"
    if n_p == target_p:
        return decision("Hold", f"{pinned}; in place", RoleState())
    source: Role = "prefill" if n_p > target_p else "decode"
    k = min(params.step_size, abs(n_p - target_p))
    names = _pick(obs, source, k, params)
    if not names:
        return decision("Hold", f"{pinned}; no {source} instance free to drain", RoleState())
    direction: Literal["FlipToDecode", "FlipToPrefill"] = "FlipToDecode" if source == "prefill" else "FlipToPrefill"
    pending = PendingFlip(direction, names, now_s, pinned)
    return decision("Drain", f"{pinned}: draining {', '.join(names)}", RoleState(pending=pending), drain=names)
