"""Functions of the request length: piecewise polynomials (degree ≤ 2) over tokens.

The KV size ``S_kv(l)`` (paper Eq. 1) and the prefill latency ``T_prefill(l)`` of a hardware class are both
piecewise polynomials in the length ``l``: measured tables are interpolated piecewise-linearly (and extended
linearly past their ends), fitted curves are quadratics, architectures give affine or capped-affine sizes.
Keeping one representation lets :mod:`prfaas_core.capacity.workload` take exact expectations of any of them over a
length distribution (``E[f(L)·1{lo < L ≤ hi}]`` is a sum of partial moments), which the planner needs for
egress and TTFT.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

INF = math.inf
_MEMO_SIZE = 8192
"""Values a curve keeps (per argument type) before it forgets them all."""


@dataclass(frozen=True)
class Piece:
    """``f(l) = c0 + c1·l + c2·l²`` for ``lo < l ≤ hi`` (``lo`` may be −inf, ``hi`` +inf)."""

    lo: float
    hi: float
    coeffs: tuple[float, float, float]

    def __call__(self, length: float) -> float:
        c0, c1, c2 = self.coeffs
        return c0 + c1 * length + c2 * length * length


@dataclass(frozen=True)
class PiecewisePolynomial:
    """A function of length made of contiguous :class:`Piece` s covering the whole real line."""

    pieces: tuple[Piece, ...]
    _his: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _memo: dict[float, float] = field(init=False, repr=False, compare=False)
    """Values already computed at whole token counts: the curves are evaluated at the same lengths again and again
    (``t``'s window of recent lengths every second, ``S_kv`` of each request's prefixes)."""
    _fmemo: dict[float, float] = field(init=False, repr=False, compare=False)
    """The same at float arguments (``T_prefill(float(tokens))``), apart: an int and an equal float are one dict
    key, and with integer coefficients their values differ in type."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_his", tuple(p.hi for p in self.pieces))
        object.__setattr__(self, "_memo", {})
        object.__setattr__(self, "_fmemo", {})
        if not self.pieces:
            raise ValueError("a piecewise polynomial needs at least one piece")
        if self.pieces[0].lo != -INF or self.pieces[-1].hi != INF:
            raise ValueError("pieces must cover (-inf, inf)")
        for left, right in zip(self.pieces, self.pieces[1:], strict=False):
            if left.hi != right.lo or not left.lo < left.hi:
                raise ValueError("pieces must be contiguous and ordered")

    @classmethod
    def polynomial(cls, c0: float, c1: float = 0.0, c2: float = 0.0) -> PiecewisePolynomial:
        """One polynomial everywhere."""
        return cls((Piece(-INF, INF, (c0, c1, c2)),))

    @classmethod
    def through_points(cls, points: Sequence[tuple[float, float]]) -> PiecewisePolynomial:
        """Linear interpolation through ``(length, value)`` points, extended linearly past both ends.

        Needs at least two points with distinct lengths (they are sorted here).
        """
        pts = sorted(points)
        if len(pts) < 2 or len({x for x, _ in pts}) != len(pts):
            raise ValueError("need at least two points with distinct lengths")
        pieces: list[Piece] = []
        n = len(pts)
        for i in range(n - 1):
            (x0, y0), (x1, y1) = pts[i], pts[i + 1]
            slope = (y1 - y0) / (x1 - x0)
            lo = -INF if i == 0 else x0
            hi = INF if i == n - 2 else x1
            pieces.append(Piece(lo, hi, (y0 - slope * x0, slope, 0.0)))
        return cls(tuple(pieces))

    def piece_at(self, length: float) -> Piece:
        """The piece holding ``length`` (``lo < length ≤ hi``)."""
        return self.pieces[min(bisect.bisect_left(self._his, length), len(self.pieces) - 1)]

    def __call__(self, length: float) -> float:
        # the hot path (S_kv and T_prefill per request, per booked stream, per second): piece_at and Piece.__call__
        # inlined, the same arithmetic; at an int or a (nonzero) float argument a value once computed is looked up
        # (the same float: the arithmetic is a function of the argument alone)
        kind = type(length)
        memo = self._memo if kind is int else self._fmemo if kind is float and length != 0.0 else None
        if memo is not None:
            value = memo.get(length)
            if value is not None:
                return value
        pieces = self.pieces
        if len(pieces) == 1:
            c0, c1, c2 = pieces[0].coeffs
        else:
            c0, c1, c2 = pieces[min(bisect.bisect_left(self._his, length), len(pieces) - 1)].coeffs
        value = c0 + c1 * length + c2 * length * length
        if memo is not None:
            if len(memo) >= _MEMO_SIZE:
                memo.clear()  # bounded: a long-lived router sees endless distinct lengths
            memo[length] = value
        return value

    def values(self, lengths: Iterable[float]) -> list[float]:
        """``[self(n) for n in lengths]``, a whole token count's value read from the memo inline (``t``'s window
        of recent lengths is priced every second: one call per length was the cost)."""
        memo = self._memo
        out: list[float] = []
        append = out.append
        for n in lengths:
            value = memo.get(n) if type(n) is int else None
            append(self(n) if value is None else value)
        return out

    def is_nondecreasing_from(self, start: float) -> bool:
        """True when the function never decreases on ``[start, inf)`` (checked per piece, exactly)."""
        for piece in self.pieces:
            if piece.hi < start:
                continue
            lo = max(piece.lo, start)
            _, c1, c2 = piece.coeffs
            # derivative c1 + 2·c2·l is affine: check it at both ends of the piece (and its sign at infinity)
            if c1 + 2 * c2 * lo < -1e-15:
                return False
            if piece.hi == INF:
                if c2 < 0 or (c2 == 0 and c1 < 0):
                    return False
            elif c1 + 2 * c2 * piece.hi < -1e-15:
                return False
        return True

    def inverse(self, value: float, lo: float, hi: float) -> float:
        """The largest ``l`` in ``[lo, hi]`` with ``f(l) ≤ value``, for ``f`` nondecreasing on the interval.

        Returns ``lo`` when ``f(lo) > value`` (no such ``l``; the caller treats the mass as empty) and
        ``hi`` when ``f(hi) ≤ value``.
        """
        if self(hi) <= value:
            return hi
        if self(lo) > value:
            return lo
        a, b = lo, hi
        for _ in range(100):
            mid = 0.5 * (a + b)
            if self(mid) <= value:
                a = mid
            else:
                b = mid
            if b - a <= 1e-9 * max(1.0, abs(b)):
                break
        return a


def least_squares_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(intercept, slope)`` of the least-squares line through the points (at least two distinct x)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    slope = sxy / sxx
    return mean_y - slope * mean_x, slope
