"""Arrival processes, length mixes that shift over the day, sessions with shared prefixes, trace replay."""

from __future__ import annotations

import itertools
import statistics

import pytest

from prfaas_core.capacity.workload import InputLengthSpec, LogNormalSpec
from prfaas_core.sim.arrivals import (
    Curve,
    generate_requests,
    requests_from_trace,
    to_trace_records,
)
from prfaas_core.sim.scenario import (
    ArrivalSpec,
    BurstSpec,
    CurvePoint,
    RequestClassSpec,
    SessionSpec,
    TimeCurveSpec,
)

CASE = [RequestClassSpec(name="case")]


def curve(points: list[tuple[float, float]], period: float = 2000) -> TimeCurveSpec:
    return TimeCurveSpec(period_seconds=period, points=[CurvePoint(at_seconds=t, value=v) for t, v in points])


def counts_per(requests, width: float, duration: float) -> list[int]:  # type: ignore[no-untyped-def]
    bins = [0] * int(duration / width)
    for r in requests:
        bins[min(int(r.arrival_s / width), len(bins) - 1)] += 1
    return bins


def test_poisson_has_the_rate_and_a_dispersion_near_one() -> None:
    reqs = generate_requests(ArrivalSpec(rate_per_second=3.0), CASE, 3600, seed=1)
    assert len(reqs) / 3600 == pytest.approx(3.0, rel=0.05)
    bins = counts_per(reqs, 10, 3600)
    assert statistics.variance(bins) / statistics.mean(bins) == pytest.approx(1.0, abs=0.3)


def test_uniform_arrivals_are_evenly_spaced() -> None:
    reqs = generate_requests(ArrivalSpec(process="uniform", rate_per_second=2.0), CASE, 100, seed=1)
    gaps = {round(b.arrival_s - a.arrival_s, 9) for a, b in itertools.pairwise(reqs)}
    assert gaps == {0.5} and len(reqs) == 200


def test_bursts_raise_the_dispersion_and_keep_the_mean() -> None:
    spec = ArrivalSpec(process="bursty", rate_per_second=1.0, burst=BurstSpec())
    reqs = generate_requests(spec, CASE, 20_000, seed=3)
    mean_multiplier = (3.0 * 20 + 0.5 * 60) / 80
    assert len(reqs) / 20_000 == pytest.approx(mean_multiplier, rel=0.1)
    bins = counts_per(reqs, 10, 20_000)
    assert statistics.variance(bins) / statistics.mean(bins) > 3.0


def test_the_rate_curve_and_class_weights_shift_over_the_day() -> None:
    day_night = curve([(0, 1), (999, 1), (1000, 0), (1999, 0), (2000, 1)])
    night_day = curve([(0, 0), (999, 0), (1000, 1), (1999, 1), (2000, 0)])
    short = InputLengthSpec(log_normal=LogNormalSpec(mu=7.0, sigma=0.5, min_tokens=16, max_tokens=8192))
    classes = [
        RequestClassSpec(name="chat", input_length=short, weight_curve=day_night),
        RequestClassSpec(name="agent", weight_curve=night_day),
    ]
    rate = curve([(0, 4), (999, 4), (1000, 1), (1999, 1), (2000, 4)])
    reqs = generate_requests(ArrivalSpec(rate_per_second=1.0, rate_curve=rate), classes, 4000, seed=2)
    day = [r for r in reqs if (r.arrival_s % 2000) < 990]
    night = [r for r in reqs if 1010 < (r.arrival_s % 2000) < 1990]
    assert all(r.klass == 0 for r in day) and all(r.klass == 1 for r in night)
    assert statistics.mean(r.input_tokens for r in day) < 3000 < statistics.mean(r.input_tokens for r in night)
    assert len(day) / len(night) == pytest.approx(4.0, rel=0.15)  # the rate falls from 4 to 1 and back
    assert Curve(rate)(999.5) == pytest.approx(2.5) and Curve(rate)(2999.5) == pytest.approx(2.5)


def test_sessions_share_their_context_with_the_next_turn() -> None:
    agent = RequestClassSpec(
        name="agent",
        output_tokens=256,
        sessions=SessionSpec(continue_probability=0.8, min_gap_seconds=5, diverge_probability=0.0, max_turns=50),
    )
    reqs = generate_requests(ArrivalSpec(rate_per_second=2.0), [agent], 1200, seed=4)
    last: dict[int, tuple[float, int]] = {}
    follow_ups = 0
    for r in reqs:
        assert 0 <= r.shared_prefix_tokens <= r.input_tokens <= 131_072
        if r.session in last:
            t, context = last[r.session]
            assert r.arrival_s - t >= 5.0
            assert r.shared_prefix_tokens == context  # the previous prompt plus its output
            follow_ups += 1
        else:
            assert r.shared_prefix_tokens == 0
        last[r.session] = (r.arrival_s, r.input_tokens + r.output_tokens)
    assert follow_ups > 0.5 * len(reqs)


def test_common_random_numbers_across_rates() -> None:
    spec = ArrivalSpec(rate_per_second=1.0)
    slow = generate_requests(spec, CASE, 1000, seed=9, rate_multiplier=1.0)
    fast = generate_requests(spec, CASE, 1000, seed=9, rate_multiplier=2.0)
    assert [r.input_tokens for r in fast[: len(slow)]] == [r.input_tokens for r in slow]
    assert fast[10].arrival_s == pytest.approx(slow[10].arrival_s / 2)


def test_a_written_trace_replays_the_same_sequence_and_compresses_time() -> None:
    agent = RequestClassSpec(name="agent", sessions=SessionSpec(continue_probability=0.5, min_gap_seconds=1))
    reqs = generate_requests(ArrivalSpec(rate_per_second=2.0), [agent], 300, seed=5)
    replay = requests_from_trace(to_trace_records(reqs))
    assert [(r.input_tokens, r.shared_prefix_tokens, r.output_tokens) for r in replay] == [
        (r.input_tokens, r.shared_prefix_tokens, r.output_tokens) for r in reqs
    ]
    assert [r.arrival_s for r in replay] == pytest.approx([r.arrival_s for r in reqs], abs=1e-6)
    sessions = {(a.session, b.session) for a, b in zip(reqs, replay, strict=True)}
    assert len(sessions) == len({r.session for r in reqs})  # one-to-one
    double = requests_from_trace(to_trace_records(reqs), rate_multiplier=2.0)
    assert double[-1].arrival_s == pytest.approx(reqs[-1].arrival_s / 2, abs=1e-6)


def test_the_same_seed_gives_the_same_sequence() -> None:
    spec = ArrivalSpec(process="bursty", rate_per_second=2.0)
    a = generate_requests(spec, CASE, 600, seed=7)
    assert a == generate_requests(spec, CASE, 600, seed=7)
    assert a != generate_requests(spec, CASE, 600, seed=8)
