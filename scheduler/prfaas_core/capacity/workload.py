"""Request-length distributions and the workload description the planner consumes.

``L`` is the *uncached* input length (paper Table 4). A distribution gives the quantities Eqs. 3–8 need:
``p(t) = P(L > t)``, ``PE(t) = E[L·1{L > t}]`` and so ``l_long = PE(t)/p`` and
``l_short = (E[L] − PE(t))/(1 − p)`` (paper-spec §2.4), plus exact expectations of piecewise polynomials
(``S_kv``, ``T_prefill``) through partial moments ``E[L^k·1{lo < L ≤ hi}]``.

Two distributions: :class:`TruncatedLogNormal` (closed form, the paper's case study: μ = 9.90, σ = 1.00,
truncated to [128, 131072]) and :class:`EmpiricalDistribution` (a list of lengths or a histogram, e.g. from a
trace). :class:`WorkloadSpec` is the user-facing description (YAML, camelCase).
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Protocol

from pydantic import Field

from ..api.base import ApiModel, CelRule
from ..request.trace import TraceRecord
from .curves import PiecewisePolynomial

_STD_NORMAL = NormalDist()


def _phi(z: float) -> float:
    """Standard normal CDF (``math.erf``), exact at ±inf."""
    if z == math.inf:
        return 1.0
    if z == -math.inf:
        return 0.0
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


class UniformSource(Protocol):
    """Anything with ``random() -> float`` in [0, 1): ``random.Random`` or a numpy ``Generator``."""

    def random(self) -> float: ...


class LengthDistribution(Protocol):
    """What the planner needs from a distribution of uncached input lengths."""

    def support(self) -> tuple[float, float]: ...

    def cdf(self, x: float) -> float: ...

    def partial_moment(self, k: int, lo: float, hi: float) -> float: ...

    def quantile(self, q: float) -> float: ...

    def sample(self, rng: UniformSource) -> int: ...


def mean(dist: LengthDistribution) -> float:
    """``E[L]``."""
    return dist.partial_moment(1, -math.inf, math.inf)


def partial_expectation(dist: LengthDistribution, t: float) -> float:
    """``PE(t) = E[L·1{L > t}]`` (paper-spec §2.4)."""
    return dist.partial_moment(1, t, math.inf)


def expect(dist: LengthDistribution, f: PiecewisePolynomial, lo: float = -math.inf, hi: float = math.inf) -> float:
    """``E[f(L)·1{lo < L ≤ hi}]``, exact for a piecewise polynomial ``f`` (sum of partial moments)."""
    total = 0.0
    for piece in f.pieces:
        a, b = max(lo, piece.lo), min(hi, piece.hi)
        if a >= b:
            continue
        c0, c1, c2 = piece.coeffs
        total += c0 * dist.partial_moment(0, a, b) + c1 * dist.partial_moment(1, a, b)
        if c2:
            total += c2 * dist.partial_moment(2, a, b)
    return total


@dataclass(frozen=True)
class TruncatedLogNormal:
    """``ln L ~ N(mu, sigma²)`` truncated to ``[min_tokens, max_tokens]``; every quantity in closed form.

    Partial moments: ``E[L^k·1{a < L ≤ b}] = e^{kμ + k²σ²/2}·[Φ((ln b − μ − kσ²)/σ) − Φ((ln a − μ − kσ²)/σ)]/Z``
    with ``Z`` the truncation mass (paper-spec §2.4 for k = 1).
    """

    mu: float
    sigma: float
    min_tokens: float
    max_tokens: float

    _alpha: float = field(init=False, repr=False, compare=False)
    _mass: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not (self.sigma > 0 and 0 < self.min_tokens < self.max_tokens):
            raise ValueError("need sigma > 0 and 0 < min_tokens < max_tokens")
        alpha = (math.log(self.min_tokens) - self.mu) / self.sigma
        beta = (math.log(self.max_tokens) - self.mu) / self.sigma
        object.__setattr__(self, "_alpha", alpha)
        object.__setattr__(self, "_mass", _phi(beta) - _phi(alpha))

    def support(self) -> tuple[float, float]:
        return (self.min_tokens, self.max_tokens)

    def cdf(self, x: float) -> float:
        if x <= self.min_tokens:
            return 0.0
        if x >= self.max_tokens:
            return 1.0
        return (_phi((math.log(x) - self.mu) / self.sigma) - _phi(self._alpha)) / self._mass

    def partial_moment(self, k: int, lo: float, hi: float) -> float:
        a, b = max(lo, self.min_tokens), min(hi, self.max_tokens)
        if a >= b:
            return 0.0
        s2 = self.sigma * self.sigma
        scale = math.exp(k * self.mu + k * k * s2 / 2.0)
        upper = _phi((math.log(b) - self.mu - k * s2) / self.sigma)
        lower = _phi((math.log(a) - self.mu - k * s2) / self.sigma)
        return scale * (upper - lower) / self._mass

    def quantile(self, q: float) -> float:
        if q <= 0.0:
            return self.min_tokens
        if q >= 1.0:
            return self.max_tokens
        u = _phi(self._alpha) + q * self._mass
        return min(self.max_tokens, max(self.min_tokens, math.exp(self.mu + self.sigma * _STD_NORMAL.inv_cdf(u))))

    def sample(self, rng: UniformSource) -> int:
        return round(self.quantile(rng.random()))


@dataclass(frozen=True)
class EmpiricalDistribution:
    """A discrete distribution over observed lengths (each with a weight, e.g. a count)."""

    lengths: tuple[float, ...]
    weights: tuple[float, ...]
    _cum: tuple[tuple[float, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lengths, weights = self.lengths, self.weights
        if not lengths or len(lengths) != len(weights):
            raise ValueError("need at least one length, and one weight per length")
        if any(map(operator.le, lengths[1:], lengths)):  # (``b <= a`` for each neighbouring ``a, b``)
            raise ValueError("lengths must be strictly increasing (use from_lengths / from_histogram)")
        total = sum(weights)
        if any(map(operator.lt, weights, itertools.repeat(0))) or total <= 0:  # (``w < 0`` for each)
            raise ValueError("weights must be non-negative with a positive sum")
        # 0.0, then the running sums of weight·length^k from 0.0, each over the total (the CDF ends at exactly 1.0)
        cum: list[tuple[float, ...]] = []
        for k in range(3):
            terms = [weight * length**k for length, weight in zip(lengths, weights, strict=True)]
            runs = itertools.accumulate(terms, initial=0.0)
            next(runs)  # (the initial 0.0: the first entry is 0.0 itself)
            cum.append((0.0, *[run / total for run in runs]))
        object.__setattr__(self, "_cum", tuple(cum))

    @classmethod
    def from_histogram(cls, pairs: Iterable[tuple[float, float]]) -> EmpiricalDistribution:
        merged: dict[float, float] = {}
        for length, weight in pairs:
            if length <= 0:
                raise ValueError(f"lengths must be positive, got {length}")
            key = float(length)
            merged[key] = merged.get(key, 0.0) + float(weight)
        keys = sorted(merged)
        return cls(tuple(keys), tuple([merged[k] for k in keys]))

    @classmethod
    def from_lengths(cls, lengths: Iterable[float]) -> EmpiricalDistribution:
        return cls.from_histogram((length, 1.0) for length in lengths)

    def support(self) -> tuple[float, float]:
        return (self.lengths[0], self.lengths[-1])

    def _index_le(self, x: float) -> int:
        """Number of lengths ≤ x."""
        return bisect.bisect_right(self.lengths, x)

    def step_index(self, x: float) -> int:
        """The step of the CDF ``x`` is on (the number of lengths ≤ ``x``): the CDF at ``x`` and every partial
        moment from ``x`` up (so :func:`expect` from ``x``) are the same all along one step."""
        return bisect.bisect_right(self.lengths, x)

    def cdf(self, x: float) -> float:
        return self._cum[0][self._index_le(x)]

    def partial_moment(self, k: int, lo: float, hi: float) -> float:
        if lo >= hi:
            return 0.0
        i, j = self._index_le(lo), self._index_le(hi)
        return self._cum[k][j] - self._cum[k][i] if j > i else 0.0

    def quantile(self, q: float) -> float:
        """The smallest length whose CDF reaches ``q``."""
        cum = self._cum[0]
        idx = bisect.bisect_left(cum, min(max(q, 0.0), 1.0) - 1e-12, lo=1)
        return self.lengths[min(idx, len(self.lengths)) - 1]

    def sample(self, rng: UniformSource) -> int:
        return round(self.quantile(rng.random()))


# --- The user-facing description ------------------------------------------------------------------------


class LogNormalSpec(ApiModel):
    """Truncated log-normal input lengths: ``ln L ~ N(mu, sigma²)`` on ``[minTokens, maxTokens]``."""

    __cel_rules__ = (
        CelRule(
            rule="self.minTokens < self.maxTokens",
            message="minTokens must be below maxTokens",
            check=lambda s: s.min_tokens < s.max_tokens,
            field_path=".minTokens",
        ),
    )

    mu: float = Field(default=9.90, ge=-50, le=50, description="Mean of ln L.")
    sigma: float = Field(default=1.00, gt=0, le=20, description="Standard deviation of ln L.")
    min_tokens: int = Field(default=128, ge=1, description="Lower truncation bound, tokens.")
    max_tokens: int = Field(default=131_072, ge=2, description="Upper truncation bound, tokens.")


class EmpiricalLengthsSpec(ApiModel):
    """Observed uncached input lengths, optionally weighted (a histogram)."""

    __cel_rules__ = (
        CelRule(
            rule="!has(self.weights) || size(self.weights) == size(self.lengthsTokens)",
            message="weights must have one entry per length",
            check=lambda s: s.weights is None or len(s.weights) == len(s.lengths_tokens),
            field_path=".weights",
        ),
    )

    lengths_tokens: list[int] = Field(min_length=1, description="Uncached input lengths, tokens (each ≥ 1).")
    weights: list[float] | None = Field(default=None, description="Weight (count) per length; default 1 each.")


class InputLengthSpec(ApiModel):
    """The uncached input-length distribution: exactly one of ``logNormal`` or ``empirical``."""

    __cel_rules__ = (
        CelRule(
            rule="has(self.logNormal) != has(self.empirical)",
            message="set exactly one of logNormal or empirical",
            check=lambda s: (s.log_normal is None) != (s.empirical is None),
            field_path=".logNormal",
        ),
    )

    log_normal: LogNormalSpec | None = Field(default=None, description="Truncated log-normal lengths.")
    empirical: EmpiricalLengthsSpec | None = Field(default=None, description="Observed lengths.")


def _default_input() -> InputLengthSpec:
    return InputLengthSpec(log_normal=LogNormalSpec())


class WorkloadSpec(ApiModel):
    """A workload for the planner; the defaults are the paper's case study (§4.1)."""

    input_length: InputLengthSpec = Field(
        default_factory=_default_input, description="Uncached input-length distribution."
    )
    output_tokens: float = Field(default=1024.0, gt=0, le=10_000_000, description="Mean output length L_out.")
    arrival_rate_per_second: float | None = Field(
        default=None, gt=0, description="Expected arrival rate Λ, req/s (optional: egress and headroom at it)."
    )


def distribution_from_spec(spec: InputLengthSpec) -> LengthDistribution:
    """Build the distribution a :class:`InputLengthSpec` describes."""
    if spec.log_normal is not None:
        ln = spec.log_normal
        return TruncatedLogNormal(ln.mu, ln.sigma, float(ln.min_tokens), float(ln.max_tokens))
    assert spec.empirical is not None
    emp = spec.empirical
    if any(length < 1 for length in emp.lengths_tokens):
        raise ValueError("empirical.lengthsTokens must all be ≥ 1")
    weights: Sequence[float] = emp.weights if emp.weights is not None else [1.0] * len(emp.lengths_tokens)
    return EmpiricalDistribution.from_histogram(zip(emp.lengths_tokens, weights, strict=True))


def workload_from_trace(records: Sequence[TraceRecord]) -> WorkloadSpec:
    """A workload from a trace: the empirical *uncached* lengths (``input_tokens − shared_prefix_tokens``,
    i.e. assuming the shared prefix is cached), mean output length, and the mean arrival rate when the trace
    spans a positive time. Uncached lengths of 0 (a full prefix hit) count as 1 token.
    """
    if not records:
        raise ValueError("the trace has no requests")
    counts: dict[int, float] = {}
    for r in records:
        length = max(1, r.uncached_tokens)
        counts[length] = counts.get(length, 0.0) + 1.0
    keys = sorted(counts)
    span = records[-1].arrival_s - records[0].arrival_s
    rate = (len(records) - 1) / span if span > 0 and len(records) > 1 else None
    out_mean = sum(r.output_tokens for r in records) / len(records)
    return WorkloadSpec(
        input_length=InputLengthSpec(
            empirical=EmpiricalLengthsSpec(lengths_tokens=keys, weights=[counts[k] for k in keys])
        ),
        output_tokens=max(out_mean, 1.0),
        arrival_rate_per_second=rate,
    )
