"""Summaries of a run: TTFT percentiles, TPOT, SLO attainment, egress over 1-s windows, offload fraction,
role flips, utilisation per stage, and whether the queues stayed bounded (and which stage's did not).

*Unbounded queues* (the throughput criterion): after a warm-up (the first 10 % of the run, which fills the
queues from empty) the run is cut into two equal windows; the mean number of requests in the system over
the later one, per arrival in it, exceeds the same ratio over the earlier one by more than ``max_growth``
(by Little's law the ratio is the mean time in the system over the window's length, so windows with more
or fewer arrivals — bursts — compare fairly; an overloaded system gains ``(λ − μ)`` requests a second, so
the ratios differ by about ``(λ − μ)/λ``). With a periodic rate curve the
windows are whole periods (``shift_s``) long, so they see the same load. The growing stage is
the one whose queue grew the most over the same windows (paper-spec §2.3's stage names).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..capacity.planner import DECODE, PD_PREFILL, PRFAAS_COMPUTE
from .results import RunResult


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of sorted values (nan when empty)."""
    if not sorted_values:
        return math.nan
    k = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]


@dataclass(frozen=True)
class RunSummary:
    name: str
    arrived: int
    completed: int
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_mean_s: float
    slo_attainment: float
    """Share of the requests that arrived (after the warm-up) meeting both SLOs; unfinished ones miss."""
    egress_mean_gbps: float
    egress_peak_gbps: float
    """Largest 1-s window of the whole run."""
    offload_fraction: float
    role_flips: int
    util_prfaas: float
    util_pd_prefill: float
    util_decode: float
    queue_growth: float
    """In-system growth between the two windows per arrival in between (see the module docstring)."""
    stable: bool
    growing_stage: str | None
    prefix_hit_tokens: int
    prefix_lost_to_linear_tokens: int
    events: int


def _mean_between(times: Sequence[float], values: Sequence[float], lo: float, hi: float) -> float:
    picked = [v for t, v in zip(times, values, strict=True) if lo <= t <= hi]
    return sum(picked) / len(picked) if picked else 0.0


def summarize(
    result: RunResult,
    arrivals_s: Sequence[float],
    warmup_s: float = 0.0,
    shift_s: float | None = None,
    max_growth: float = 0.03,
) -> RunSummary:
    """Summarise ``result``; ``arrivals_s`` are every request's arrival times (finished or not)."""
    d = result.duration_s
    counted = [a for a in arrivals_s if warmup_s <= a <= d]
    ok = sum(1 for a, good in zip(result.arrival_s, result.slo_ok, strict=True) if good and warmup_s <= a <= d)
    ttfts = sorted(x for a, x in zip(result.arrival_s, result.ttft_s, strict=True) if warmup_s <= a <= d)
    tpots = result.tpot_s
    s = result.series
    in_run = [e for t, e in zip(s.time_s, s.egress_gbps, strict=True) if t <= d]
    remote = sum(1 for r in result.remote if r)
    usable = 0.9 * d  # the first 10 % fill the queues from empty
    shift = shift_s if shift_s is not None and shift_s <= usable / 2 else 0.5 * usable
    w = max(1.0, shift)
    t_end_lo, t_ref_lo = d - w, d - w - shift
    growth = math.nan
    stage: str | None = None
    if t_ref_lo >= 0:
        end = _mean_between(s.time_s, s.in_system, t_end_lo, d)
        ref = _mean_between(s.time_s, s.in_system, t_ref_lo, d - shift)
        a_end = sum(1 for a in arrivals_s if t_end_lo < a <= d)
        a_ref = sum(1 for a in arrivals_s if t_ref_lo < a <= d - shift)
        # Little: in-system per arrival is the mean sojourn over the window length; it grows when overloaded
        growth = end / max(a_end, 1) - ref / max(a_ref, 1)
        grows = {
            PD_PREFILL: _mean_between(s.time_s, s.queue_prefill, t_end_lo, d)
            - _mean_between(s.time_s, s.queue_prefill, t_ref_lo, d - shift),
            PRFAAS_COMPUTE: _mean_between(s.time_s, s.queue_prfaas, t_end_lo, d)
            - _mean_between(s.time_s, s.queue_prfaas, t_ref_lo, d - shift),
            DECODE: _mean_between(s.time_s, s.queue_decode, t_end_lo, d)
            - _mean_between(s.time_s, s.queue_decode, t_ref_lo, d - shift),
        }
        top = max(grows, key=lambda k: grows[k])
        stage = top if grows[top] > 0 else None
    stable = not (growth > max_growth)
    n_util = max(result.util_samples, 1)
    return RunSummary(
        name=result.name,
        arrived=len(arrivals_s),
        completed=result.completed,
        ttft_mean_s=sum(ttfts) / len(ttfts) if ttfts else math.nan,
        ttft_p50_s=quantile(ttfts, 0.5),
        ttft_p90_s=quantile(ttfts, 0.9),
        ttft_p99_s=quantile(ttfts, 0.99),
        tpot_mean_s=sum(tpots) / len(tpots) if tpots else math.nan,
        slo_attainment=ok / len(counted) if counted else math.nan,
        egress_mean_gbps=sum(in_run) / len(in_run) if in_run else 0.0,
        egress_peak_gbps=max(s.egress_gbps, default=0.0),
        offload_fraction=remote / len(result.remote) if result.remote else 0.0,
        role_flips=result.flips,
        util_prfaas=result.util_prfaas_sum / n_util,
        util_pd_prefill=result.util_pd_prefill_sum / n_util,
        util_decode=result.util_decode_sum / n_util,
        queue_growth=growth,
        stable=stable,
        growing_stage=None if stable else stage,
        prefix_hit_tokens=result.pool_hit_tokens,
        prefix_lost_to_linear_tokens=result.pool_block_match_tokens - result.pool_hit_tokens,
        events=result.events,
    )
