"""The routing threshold ``t`` in force: ``t_min`` from the planner (compute balance, Eq. 7), raised under
link pressure to the bandwidth-feasible bound ``t_bw`` (paper-spec §2.4–2.5), never below ``t_min`` and
never above ``t_max`` (the operator is the one writer of both bounds; routers move ``t`` only within them).

``t_bw`` is computed on the *incremental* lengths of the recent window (after prefix matching), as the
paper prescribes: the smallest ``t`` at which the window's requests, routed with ``t``, would have produced
no more egress than the budget. The budget depends on the link's mode, which makes ``t`` itself hysteretic:
abundant -> budget at the scarce watermark (intervene only before the link would turn scarce); scarce ->
budget at the abundant watermark (pull egress well below, so the link can recover).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..kv import KvModel
from ..names import GBPS_BITS
from ..planner import egress_floor_threshold
from ..workload import EmpiricalDistribution
from .link import LinkMode, LinkParams


@dataclass(frozen=True)
class ThresholdBounds:
    """Bounds on ``t`` published by the one writer (operator or ``prfaas up``)."""

    min_tokens: int
    max_tokens: int = 1 << 30

    def clamp(self, tokens: int) -> int:
        return max(self.min_tokens, min(self.max_tokens, tokens))


@dataclass(frozen=True)
class ThresholdDecision:
    tokens: int
    bandwidth_floor_tokens: int
    reason: str


def decide_threshold(
    mode: LinkMode,
    bounds: ThresholdBounds,
    recent_uncached_lengths: Sequence[int],
    window_s: float,
    kv: KvModel,
    link: LinkParams,
) -> ThresholdDecision:
    """``t = clamp(max(t_min, t_bw(window, budget(mode))))``."""
    watermark = link.abundant_watermark if mode == "scarce" else link.scarce_watermark
    budget_gbps = link.cap_gbps * watermark
    # a fully cached request puts nothing on the link
    recent_uncached_lengths = [n for n in recent_uncached_lengths if n > 0]
    if not recent_uncached_lengths or window_s <= 0:
        return ThresholdDecision(bounds.min_tokens, 0, f"no recent requests: t = t_min = {bounds.min_tokens}")
    # cheap exit (most calls): the window's egress with t = t_min already fits the budget
    at_t_min = sum(kv.kv_bytes(n) for n in recent_uncached_lengths if n > bounds.min_tokens)
    if at_t_min * 8.0 / window_s / GBPS_BITS <= budget_gbps:
        return ThresholdDecision(
            bounds.min_tokens, 0, f"link {mode}: t = t_min = {bounds.min_tokens} (fits the budget)"
        )
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
