"""Elastic capacity: how many instances a cluster should run, from its demand, within its bounds and budget.

One decision for both kinds (the PrFaaS site sized by region A's operator, the PD cluster's total by region
B's), pure and returned with its reason; the operator, the simulator and ``prfaas up`` call it, each with what
its own region sees.

*Demand* is expressed in instances (fractional): :func:`prefill_demand` from the prompt tokens arriving, the
backlog the queue holds (to be cleared within the TTFT objective of a typical prompt,
:func:`~prfaas_core.request.slo.ttft_objective_s`) and one instance's prefill throughput from the capacity
model; for the site, prefill whose KV the link cannot carry is waste, so the link's cap at the current ``t``
bounds it (:func:`link_bound_instances`); :func:`decode_demand` from output tokens against one instance's
decode capacity. :func:`forecast` adds the rise expected over an instance's start-up time, so a scale-out
asked for now is ready when the load is there.

*The decision* (:func:`decide_scale`) follows the HorizontalPodAutoscaler's algorithm, so SREs meet no
surprise: a tolerance band around the current size (no change for a ±10 % wobble), a scale-up stabilisation
window (default 0: out at once) and a scale-down one (default 300 s: in only to the *highest* recommendation
of the window, so a dip shorter than the window moves nothing), and at most ``scale_down_step`` instances
removed per decision (the operator drains them first). Bounds: ``min``/``max`` and the budget
(``budget_per_hour`` / price per instance-hour, after the link's cost); a recommendation above either is
clamped and reported as blocked (an alert watches it). Desired vs ready is reported, never assumed: pending
instances (no GPU yet) count as desired, not ready, and a scale-out is not repeated while they are still
starting (the recommendation already holds them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from ..capacity.hardware import HardwareProfile
from ..capacity.kv import KvModel
from ..request.slo import SloLike, ttft_objective_s

Blocked = Literal["max", "budget"]


@dataclass(frozen=True)
class ScaleBounds:
    """Where a cluster may go: ``min``/``max`` instances and an hourly budget (``None``: unbounded)."""

    min_instances: int
    max_instances: int
    budget_per_hour: float | None = None
    price_per_instance_hour: float | None = None
    fixed_cost_per_hour: float = 0.0
    """Spent before any instance (for the site: the link's GB x price at the current egress)."""

    def __post_init__(self) -> None:
        if self.min_instances < 0 or self.max_instances < self.min_instances:
            raise ValueError(f"bounds: need 0 <= min ({self.min_instances}) <= max ({self.max_instances})")

    def budget_instances(self) -> int | None:
        """The most instances the budget pays for, or ``None`` where no budget or no price is set."""
        if self.budget_per_hour is None or not self.price_per_instance_hour:
            return None
        left = self.budget_per_hour - self.fixed_cost_per_hour
        return max(0, math.floor(left / self.price_per_instance_hour + 1e-9))


@dataclass(frozen=True)
class ScaleBehavior:
    """How fast the size moves (the HPA's ``behavior``, same meaning)."""

    tolerance: float = 0.1
    scale_up_window_s: float = 0.0
    scale_down_window_s: float = 300.0
    scale_down_step: int = 1
    startup_s: float = 120.0
    """An instance's start-up time: the forecast horizon, and how long a new instance may stay not ready."""


@dataclass(frozen=True)
class ScaleMemory:
    """What the decision remembers between calls: recent recommendations ``(t, n)`` within the longest window."""

    recommendations: tuple[tuple[float, int], ...] = ()
    last_change_s: float | None = None


@dataclass(frozen=True)
class ScaleDecision:
    desired: int
    previous: int
    recommended: int
    """The recommendation this call, after bounds, before stabilisation."""
    reason: str
    blocked: Blocked | None
    memory: ScaleMemory = field(default_factory=ScaleMemory)

    @property
    def changed(self) -> bool:
        return self.desired != self.previous

    @property
    def direction(self) -> Literal["out", "in", "hold"]:
        return "out" if self.desired > self.previous else "in" if self.desired < self.previous else "hold"


def prefill_demand(
    prompt_tokens_per_s: float,
    backlog_tokens: float,
    instance_tokens_per_s: float,
    ttft_objective_s: float,
    target_utilization: float = 0.8,
) -> float:
    """Instances prefill needs: the arriving tokens, plus the backlog cleared within one TTFT objective, at
    ``target_utilization`` of one instance's throughput (headroom for bursts)."""
    if instance_tokens_per_s <= 0 or ttft_objective_s <= 0 or not 0 < target_utilization <= 1:
        raise ValueError("prefill_demand: throughput, TTFT objective and utilisation must be positive")
    work = max(0.0, prompt_tokens_per_s) + max(0.0, backlog_tokens) / ttft_objective_s
    return work / (instance_tokens_per_s * target_utilization)


def decode_demand(output_tokens_per_s: float, instance_tokens_per_s: float, target_utilization: float = 0.8) -> float:
    """Instances decode needs: output tokens per second against one instance's capacity at the decode SLO."""
    if instance_tokens_per_s <= 0 or not 0 < target_utilization <= 1:
        raise ValueError("decode_demand: throughput and utilisation must be positive")
    return max(0.0, output_tokens_per_s) / (instance_tokens_per_s * target_utilization)


def link_bound_instances(cap_gbps: float, gbits_per_prompt_token: float, instance_tokens_per_s: float) -> float:
    """The most PrFaaS instances whose KV the link's cap carries: more prefill than that is waste."""
    if gbits_per_prompt_token <= 0 or instance_tokens_per_s <= 0:
        return math.inf
    return max(0.0, cap_gbps) / (gbits_per_prompt_token * instance_tokens_per_s)


@dataclass(frozen=True)
class Load:
    """What a cluster's engines report over the rate window, summed over its pods (vLLM's series)."""

    prompt_tokens_per_s: float = 0.0
    requests_per_s: float = 0.0
    waiting: float = 0.0
    generation_tokens_per_s: float = 0.0
    decode_waiting: float = 0.0

    def mean_prompt_tokens(self, default: float = 1024.0) -> float:
        if self.requests_per_s > 1e-9 and self.prompt_tokens_per_s > 0:
            return self.prompt_tokens_per_s / self.requests_per_s
        return default


def _prefill_part(load: Load, hw: HardwareProfile, slo: SloLike, utilization: float) -> tuple[float, float, float]:
    """(instances, mean prompt, one instance's tokens/s at that length)."""
    length = load.mean_prompt_tokens()
    per_instance = length / hw.prefill_seconds(length)
    backlog = load.waiting * length
    need = prefill_demand(load.prompt_tokens_per_s, backlog, per_instance, ttft_objective_s(slo, length), utilization)
    return need, length, per_instance


def site_demand(
    load: Load,
    hw: HardwareProfile,
    slo: SloLike,
    utilization: float,
    kv: KvModel | None = None,
    link_cap_gbps: float | None = None,
) -> tuple[float, str]:
    """The PrFaaS site's demand in instances, and what it came from; bounded by what the link's cap carries at
    the mean prompt (``kv`` and ``link_cap_gbps`` given: the site schedules its link)."""
    need, length, per_instance = _prefill_part(load, hw, slo, utilization)
    why = (
        f"{load.prompt_tokens_per_s:.0f} prompt tok/s, {load.waiting:.0f} waiting, mean prompt {length:.0f}, "
        f"{per_instance:.0f} tok/s per instance"
    )
    if kv is not None and link_cap_gbps is not None:
        gbits_per_token = kv.kv_bytes(length) * 8 / 1e9 / length
        bound = link_bound_instances(link_cap_gbps, gbits_per_token, per_instance)
        if bound < need:
            why += f"; the link's cap {link_cap_gbps:g} Gbps carries the KV of {bound:.2f}"
            need = bound
    return need, why


def pd_demand(prefill: Load, decode: Load, hw: HardwareProfile, slo: SloLike, utilization: float) -> tuple[float, str]:
    """A PD cluster's total demand (prefill it serves itself + decode of everything), and what it came from."""
    p_need, length, _ = _prefill_part(prefill, hw, slo, utilization)
    if hw.decode is None:
        raise ValueError(f"hardware {hw.accelerator!r} has no decode capacity: give spec.hardware.decode")
    d_need = decode_demand(decode.generation_tokens_per_s, hw.decode.tokens_per_second, utilization)
    d_need += max(0.0, decode.decode_waiting) / (hw.decode.max_batch_size * utilization)  # a batch slot each
    why = (
        f"prefill {p_need:.2f} ({prefill.prompt_tokens_per_s:.0f} prompt tok/s, {prefill.waiting:.0f} waiting, "
        f"mean prompt {length:.0f}) + decode {d_need:.2f} ({decode.generation_tokens_per_s:.0f} out tok/s, "
        f"{decode.decode_waiting:.0f} waiting)"
    )
    return p_need + d_need, why


def forecast(samples: Sequence[tuple[float, float]], horizon_s: float) -> float:
    """The last value plus the rise a least-squares trend over ``samples`` gives within ``horizon_s`` (a fall is
    not forecast: scale-in waits for the fall itself)."""
    if not samples:
        return 0.0
    last = samples[-1][1]
    if len(samples) < 2 or horizon_s <= 0:
        return last
    n = len(samples)
    mt = sum(t for t, _ in samples) / n
    mv = sum(v for _, v in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    if var <= 0:
        return last
    slope = sum((t - mt) * (v - mv) for t, v in samples) / var
    return last + max(0.0, slope) * horizon_s


def decide_scale(
    now_s: float,
    current: int,
    demand: float,
    bounds: ScaleBounds,
    behavior: ScaleBehavior = ScaleBehavior(),
    memory: ScaleMemory = ScaleMemory(),
    ready: int | None = None,
    why: str = "",
) -> ScaleDecision:
    """The size to run now. ``current`` is the size in force (desired so far), ``demand`` the instances the load
    needs (fractional, forecast included), ``ready`` how many serve (reported, and never double-counted: a
    scale-out still starting is not asked for again). ``why`` names the demand's inputs for the reason."""
    cap = bounds.max_instances
    blocked: Blocked | None = None
    by_budget = bounds.budget_instances()
    if by_budget is not None and by_budget < cap:
        cap = max(bounds.min_instances, by_budget)
    raw = math.ceil(demand - 1e-9) if demand > 0 else 0
    if current > 0 and abs(demand / current - 1.0) <= behavior.tolerance:
        raw = current  # within the tolerance band: no change (the HPA's rule)
    if raw > cap:
        blocked = "budget" if by_budget is not None and cap < bounds.max_instances else "max"
    recommended = min(max(raw, bounds.min_instances), cap)
    horizon = max(behavior.scale_up_window_s, behavior.scale_down_window_s)
    recs = (*((t, n) for t, n in memory.recommendations if t > now_s - horizon), (now_s, recommended))
    if current < bounds.min_instances or current > cap:  # bounds moved: obey them at once
        desired = min(max(current, bounds.min_instances), cap)
        verdict = f"bounds [{bounds.min_instances}, {cap}]"
    elif recommended > current:
        up = [n for t, n in recs if t > now_s - behavior.scale_up_window_s] or [recommended]
        desired = max(current, min(up))
        verdict = "scale out" if desired > current else f"scale out held ({behavior.scale_up_window_s:g}s window)"
    elif recommended < current:
        down = [n for t, n in recs if t > now_s - behavior.scale_down_window_s] or [recommended]
        desired = max(min(current, max(down)), current - behavior.scale_down_step)
        verdict = "scale in" if desired < current else f"scale in held ({behavior.scale_down_window_s:g}s window)"
    else:
        desired, verdict = current, "hold"
    parts = [f"{verdict}: demand {demand:.2f} instances" + (f" ({why})" if why else "")]
    parts.append(f"desired {desired}, was {current}" + ("" if ready is None else f", {ready} ready"))
    if blocked is not None:
        limit = f"budget {bounds.budget_per_hour:g}/h" if blocked == "budget" else f"max {bounds.max_instances}"
        parts.append(f"blocked by {limit} at {cap}")
    mem = ScaleMemory(recs, now_s if desired != current else memory.last_change_s)
    return ScaleDecision(desired, current, recommended, "; ".join(parts), blocked, mem)


def seeded(memory: ScaleMemory, now_s: float, current: int) -> ScaleMemory:
    """Memory for a loop that starts (or restarts) at size ``current``: the scale-down window starts now, so a
    restart never scales in on its first look."""
    if memory.recommendations:
        return memory
    return replace(memory, recommendations=((now_s, current),))
