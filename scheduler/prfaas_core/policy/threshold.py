"""The routing threshold ``t`` in force: ``t_min`` from the planner (compute balance, Eq. 7), raised under
link pressure to the bandwidth-feasible bound ``t_bw`` (paper-spec §2.4–2.5), never below ``t_min`` and
never above ``t_max`` (the operator is the one writer of both bounds; routers move ``t`` only within them).

``t_bw`` is computed on the *incremental* lengths of the recent window (after prefix matching), as the
paper prescribes: the smallest ``t`` at which the window's requests, routed with ``t``, would have produced
no more egress than the budget. The budget depends on the link's mode, which makes ``t`` itself hysteretic:
abundant -> budget at the scarce watermark (intervene only before the link would turn scarce); scarce ->
budget at the abundant watermark (pull egress well below, so the link can recover).

The long-term side of the same bound lives here too, so that every bound on ``t`` has one place:
:func:`bandwidth_floor_tokens` (``t_bw`` at the arrival rate implied by a link's *measured* egress, shown on
the InterDCLink and raising the PD cluster's ``t`` in force while the link is scarce),
:func:`threshold_in_force` (``max(t_min, floors)``, or the SRE's pin) and :func:`published_bounds` (the
``[min, max]`` the one writer publishes to the routers).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..capacity.kv import KvModel
from ..capacity.plan_inputs import PlanInputs
from ..capacity.planner import egress_floor_threshold
from ..capacity.workload import EmpiricalDistribution, expect
from ..names import GBPS_BITS, NO_THRESHOLD_TOKENS
from .link_state import LinkMode, LinkParams


@dataclass(frozen=True)
class ThresholdBounds:
    """Bounds on ``t`` published by the one writer (operator or ``prfaas up``)."""

    min_tokens: int
    max_tokens: int = NO_THRESHOLD_TOKENS

    def clamp(self, tokens: int) -> int:
        return max(self.min_tokens, min(self.max_tokens, tokens))


@dataclass(frozen=True)
class ThresholdDecision:
    tokens: int
    bandwidth_floor_tokens: int
    reason: str


def egress_budget(mode: LinkMode, link: LinkParams) -> tuple[float, float]:
    """``(watermark, budget_gbps)`` the bound keeps egress under: the scarce watermark while abundant (step in
    only before the link would turn scarce), the abundant watermark while scarce (let it recover)."""
    watermark = link.abundant_watermark if mode == "scarce" else link.scarce_watermark
    return watermark, link.cap_gbps * watermark


def bandwidth_floor_tokens(
    inputs: PlanInputs, threshold_tokens: float, egress_gbps: float, link: LinkParams, mode: LinkMode
) -> int:
    """``t_bw`` at the load a link measures (paper-spec §2.4): the arrival rate is recovered from the measured
    egress and the ``t`` it was produced under (``Λ = egress / E[S_kv(L)·1{L > t}]``), then ``t_bw`` is the
    smallest ``t`` whose egress at that rate fits :func:`egress_budget`. 0: nothing to bound."""
    if egress_gbps <= 0:
        return 0
    per_request = expect(inputs.lengths, inputs.kv.curve, threshold_tokens, math.inf)
    if per_request <= 0:
        return 0
    rate = egress_gbps * GBPS_BITS / 8.0 / per_request
    return egress_floor_threshold(inputs.lengths, inputs.kv, rate, egress_budget(mode, link)[1])


def threshold_in_force(t_min: int | None, floors: Sequence[int], override: int | None) -> int | None:
    """The long-term ``t`` in force: the SRE's pin, else ``max(t_min, the scarce links' floors)``."""
    if override is not None:
        return override
    if t_min is None:
        return None
    return max([t_min, *floors])


def published_bounds(t_min: int | None, override: int | None) -> ThresholdBounds:
    """The bounds the one writer publishes to the routers: ``[t_min, T_MAX]`` (routers raise ``t`` under link
    pressure themselves), or ``[pin, pin]`` when the SRE pins ``t`` (routers stop adapting it)."""
    if override is not None:
        return ThresholdBounds(override, override)
    lo = t_min if t_min is not None else 0
    return ThresholdBounds(lo, max(lo, NO_THRESHOLD_TOKENS))


def decide_threshold(
    mode: LinkMode,
    bounds: ThresholdBounds,
    recent_uncached_lengths: Sequence[int],
    window_s: float,
    kv: KvModel,
    link: LinkParams,
) -> ThresholdDecision:
    """``t = clamp(max(t_min, t_bw(window, budget(mode))))``."""
    watermark, budget_gbps = egress_budget(mode, link)
    t_min = bounds.min_tokens
    # a fully cached request puts nothing on the link: only lengths > 0 count (the ones above t_min, read every
    # refresh, are among them; the others are listed only past the cheap exit below)
    above = [n for n in recent_uncached_lengths if n > max(t_min, 0)]
    if window_s <= 0 or not (above or any(n > 0 for n in recent_uncached_lengths)):
        return ThresholdDecision(bounds.min_tokens, 0, f"no recent requests: t = t_min = {bounds.min_tokens}")
    # cheap exit (most calls): the window's egress with t = t_min already fits the budget
    s_kv = kv.curve  # kv.kv_bytes without its call, for the window at once: evaluated per length per refresh
    at_t_min = sum(s_kv.values(above))
    if at_t_min * 8.0 / window_s / GBPS_BITS <= budget_gbps:
        return _fits_budget(mode, t_min)
    recent_uncached_lengths = [n for n in recent_uncached_lengths if n > 0]
    dist = EmpiricalDistribution.from_lengths(recent_uncached_lengths)
    rate = len(recent_uncached_lengths) / window_s
    t_bw = egress_floor_threshold(dist, kv, rate, budget_gbps)
    tokens = bounds.clamp(max(bounds.min_tokens, t_bw))
    if t_bw > bounds.min_tokens:
        reason = (
            f"link {mode}: t raised to {tokens} (t_bw {t_bw} keeps the last {window_s:.0f} s of traffic at "
            f"<= {budget_gbps:.2f} Gbps, {watermark:.0%} of the cap)"
        )
    else:
        reason = f"link {mode}: t = t_min = {bounds.min_tokens} (t_bw {t_bw} not binding)"
    return ThresholdDecision(tokens, t_bw, reason)


def calendar_threshold(
    mode: LinkMode,
    bounds: ThresholdBounds,
    recent_uncached_lengths: Sequence[int],
    window_s: float,
    kv: KvModel,
    link: LinkParams,
) -> ThresholdDecision:
    """``t`` when the link is scheduled: ``t_bw`` against the whole cap instead of a watermark below it.

    The watermarks keep an *unscheduled* link's egress below the cap (streams admitted one by one overshoot);
    a calendar books streams up to the cap and makes the rest wait for a window, so ``t`` need rise only when
    the recent traffic above it would not fit the cap even then (waits would grow without bound). A drop-in
    for :func:`~.threshold.decide_threshold` in a :class:`~.short_term.ShortTermPolicy`."""
    d = decide_threshold("abundant", bounds, recent_uncached_lengths, window_s, kv, _whole_cap(link))
    return ThresholdDecision(d.tokens, d.bandwidth_floor_tokens, f"link calendar ({mode}): {d.reason}")


@functools.lru_cache(maxsize=64)
def _fits_budget(mode: LinkMode, t_min: int) -> ThresholdDecision:
    """:func:`decide_threshold`'s answer when the window fits the budget at ``t_min`` (most refreshes: one value per
    mode and ``t_min``, shared, instead of a new one every second)."""
    return ThresholdDecision(t_min, 0, f"link {mode}: t = t_min = {t_min} (fits the budget)")


@functools.lru_cache(maxsize=64)
def _whole_cap(link: LinkParams) -> LinkParams:
    """``link`` with its scarce watermark at the cap (made once per link: :func:`calendar_threshold` runs every
    second, and ``dataclasses.replace`` is slow)."""
    return replace(link, scarce_watermark=1.0, abundant_watermark=min(link.abundant_watermark, 0.99))
