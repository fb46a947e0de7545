"""Length distributions (closed forms against numerical integration), WorkloadSpec, traces -> workloads."""

from __future__ import annotations

import math
import random

import pytest
from pydantic import ValidationError

from prfaas_core.capacity.curves import PiecewisePolynomial
from prfaas_core.capacity.workload import (
    EmpiricalDistribution,
    TruncatedLogNormal,
    WorkloadSpec,
    distribution_from_spec,
    expect,
    mean,
    partial_expectation,
    workload_from_trace,
)
from prfaas_core.request.trace import TraceRecord

CASE = TruncatedLogNormal(9.90, 1.00, 128, 131_072)


def _numeric_partial_moment(dist: TruncatedLogNormal, k: int, lo: float, hi: float, n: int = 20_000) -> float:
    """Midpoint rule in ln(l) on the truncated log-normal density (independent of the closed form)."""
    a, b = math.log(max(lo, dist.min_tokens)), math.log(min(hi, dist.max_tokens))
    mass = 0.5 * (
        math.erf((math.log(dist.max_tokens) - dist.mu) / (dist.sigma * math.sqrt(2)))
        - math.erf((math.log(dist.min_tokens) - dist.mu) / (dist.sigma * math.sqrt(2)))
    )
    h, total = (b - a) / n, 0.0
    for i in range(n):
        y = a + (i + 0.5) * h
        pdf = math.exp(-((y - dist.mu) ** 2) / (2 * dist.sigma**2)) / (dist.sigma * math.sqrt(2 * math.pi))
        total += math.exp(k * y) * pdf * h
    return total / mass


@pytest.mark.parametrize("k", [0, 1, 2])
@pytest.mark.parametrize(("lo", "hi"), [(0, math.inf), (19_400, math.inf), (1000, 20_000), (50_000, 60_000)])
def test_partial_moments_match_numerical_integration(k: int, lo: float, hi: float) -> None:
    assert CASE.partial_moment(k, lo, hi) == pytest.approx(_numeric_partial_moment(CASE, k, lo, hi), rel=1e-5)


def test_case_study_statistics_match_paper_spec_3_2() -> None:
    assert mean(CASE) == pytest.approx(27_486, rel=1e-3)
    assert CASE.quantile(0.5) == pytest.approx(19_200, rel=0.01)
    assert CASE.quantile(0.9) == pytest.approx(62_300, rel=0.005)
    assert CASE.quantile(0.99) == pytest.approx(115_500, rel=0.005)
    t = 19_400
    p = 1 - CASE.cdf(t)
    assert p == pytest.approx(0.4957, abs=5e-4)
    assert partial_expectation(CASE, t) / p == pytest.approx(45_046, rel=2e-3)  # l_long ≈ 44.0 Ki
    assert (mean(CASE) - partial_expectation(CASE, t)) / (1 - p) == pytest.approx(10_224, rel=2e-3)


def test_cdf_and_quantile_are_inverse_and_bounded() -> None:
    for q in (0.01, 0.25, 0.5, 0.75, 0.99):
        assert CASE.cdf(CASE.quantile(q)) == pytest.approx(q, abs=1e-9)
    assert CASE.cdf(100) == 0.0 and CASE.cdf(200_000) == 1.0
    assert CASE.quantile(0) == 128 and CASE.quantile(1) == 131_072
    assert CASE.support() == (128, 131_072)


def test_sampling_follows_the_distribution() -> None:
    rng = random.Random(7)
    samples = [CASE.sample(rng) for _ in range(20_000)]
    assert all(128 <= s <= 131_072 for s in samples)
    assert all(isinstance(s, int) for s in samples)
    assert sum(samples) / len(samples) == pytest.approx(mean(CASE), rel=0.03)
    assert sum(s > 19_400 for s in samples) / len(samples) == pytest.approx(0.4957, abs=0.015)


def test_truncated_log_normal_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError):
        TruncatedLogNormal(9.9, 0.0, 128, 1000)
    with pytest.raises(ValueError):
        TruncatedLogNormal(9.9, 1.0, 1000, 128)


def test_expect_of_a_piecewise_linear_curve_matches_integration() -> None:
    f = PiecewisePolynomial.through_points([(1000, 1.0), (30_000, 2.0), (100_000, 10.0)])
    # integrate piece by piece numerically: E[f(L) 1{lo<L≤hi}] = sum c0 M0 + c1 M1
    expected = 0.0
    for piece in f.pieces:
        c0, c1, _ = piece.coeffs
        lo, hi = max(piece.lo, 20_000), piece.hi
        if lo < hi:
            expected += c0 * _numeric_partial_moment(CASE, 0, lo, hi) + c1 * _numeric_partial_moment(CASE, 1, lo, hi)
    assert expect(CASE, f, 20_000) == pytest.approx(expected, rel=1e-5)
    assert expect(CASE, PiecewisePolynomial.polynomial(3.0)) == pytest.approx(3.0)


def test_empirical_distribution_from_lengths() -> None:
    dist = EmpiricalDistribution.from_lengths([3, 1, 2, 2])
    assert dist.support() == (1, 3)
    assert dist.cdf(0.5) == 0 and dist.cdf(1) == 0.25 and dist.cdf(2) == 0.75 and dist.cdf(3) == 1
    assert mean(dist) == pytest.approx(2.0)
    assert dist.partial_moment(1, 1, math.inf) == pytest.approx((2 + 2 + 3) / 4)  # strictly above 1
    assert dist.partial_moment(2, -math.inf, 2) == pytest.approx((1 + 4 + 4) / 4)
    assert [dist.quantile(q) for q in (0, 0.25, 0.26, 0.75, 0.9, 1)] == [1, 1, 2, 2, 3, 3]
    assert expect(dist, PiecewisePolynomial.polynomial(0, 0, 1)) == pytest.approx(18 / 4)
    rng = random.Random(1)
    assert {dist.sample(rng) for _ in range(200)} == {1, 2, 3}


def test_empirical_histogram_merges_duplicates_and_rejects_bad_lengths() -> None:
    dist = EmpiricalDistribution.from_histogram([(10, 1.0), (20, 3.0), (10, 1.0)])
    assert dist.lengths == (10.0, 20.0) and dist.weights == (2.0, 3.0)
    with pytest.raises(ValueError):
        EmpiricalDistribution.from_histogram([(0, 1.0)])
    with pytest.raises(ValueError):
        EmpiricalDistribution.from_lengths([])


def test_workload_spec_defaults_to_the_case_study() -> None:
    spec = WorkloadSpec()
    dist = distribution_from_spec(spec.input_length)
    assert dist == CASE
    assert spec.output_tokens == 1024
    assert spec.arrival_rate_per_second is None


def test_workload_spec_parses_camel_case_and_is_strict() -> None:
    spec = WorkloadSpec.model_validate(
        {
            "inputLength": {"logNormal": {"mu": 9, "sigma": 0.5, "minTokens": 64, "maxTokens": 65536}},
            "outputTokens": 512,
            "arrivalRatePerSecond": 2,
        }
    )
    assert distribution_from_spec(spec.input_length) == TruncatedLogNormal(9.0, 0.5, 64, 65536)
    assert spec.output_tokens == 512 and spec.arrival_rate_per_second == 2
    with pytest.raises(ValidationError, match="outputTokenz"):
        WorkloadSpec.model_validate({"outputTokenz": 1})
    with pytest.raises(ValidationError, match="exactly one of logNormal or empirical"):
        WorkloadSpec.model_validate({"inputLength": {}})
    with pytest.raises(ValidationError, match="minTokens must be below maxTokens"):
        WorkloadSpec.model_validate({"inputLength": {"logNormal": {"minTokens": 500, "maxTokens": 100}}})
    with pytest.raises(ValidationError, match="one entry per length"):
        WorkloadSpec.model_validate({"inputLength": {"empirical": {"lengthsTokens": [1, 2], "weights": [1.0]}}})


def test_empirical_workload_spec_builds_a_weighted_distribution() -> None:
    spec = WorkloadSpec.model_validate(
        {"inputLength": {"empirical": {"lengthsTokens": [100, 300], "weights": [3.0, 1.0]}}}
    )
    dist = distribution_from_spec(spec.input_length)
    assert mean(dist) == pytest.approx(150.0)


def test_workload_from_trace_uses_uncached_lengths_rate_and_output_mean() -> None:
    records = [
        TraceRecord(arrival_s=0.0, input_tokens=1000, output_tokens=100, session_id="a"),
        TraceRecord(arrival_s=1.0, input_tokens=1500, output_tokens=300, session_id="a", shared_prefix_tokens=1000),
        TraceRecord(arrival_s=2.0, input_tokens=500, output_tokens=200, session_id="b", shared_prefix_tokens=500),
    ]
    spec = workload_from_trace(records)
    dist = distribution_from_spec(spec.input_length)
    assert dist.support() == (1, 1000)  # a full prefix hit counts as one token
    assert mean(dist) == pytest.approx((1000 + 500 + 1) / 3)
    assert spec.output_tokens == pytest.approx(200)
    assert spec.arrival_rate_per_second == pytest.approx(1.0)
    single = workload_from_trace(records[:1])
    assert single.arrival_rate_per_second is None
    with pytest.raises(ValueError):
        workload_from_trace([])


def test_a_curve_gives_the_same_value_at_a_whole_token_count_from_its_memo_and_keeps_the_memo_bounded() -> None:
    from prfaas_core.capacity import curves

    f = PiecewisePolynomial.through_points([(0.0, 1.5), (1000.0, 7.25), (5000.0, 9.0)])
    for n in (0, 1, 999, 1000, 1001, 4321, 10_000):
        first, again = f(n), f(n)  # computed, then looked up
        piece = f.piece_at(n)
        assert first == again == piece(n)
        assert type(first) is type(piece(n))
        assert f(float(n)) == piece(float(n))
    for n in range(curves._MEMO_SIZE + 10):
        f(n)
    assert len(f._memo) <= curves._MEMO_SIZE
