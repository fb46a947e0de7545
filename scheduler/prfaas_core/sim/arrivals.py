"""The request sequence a run replays: arrival times, lengths, sessions and shared prefixes.

Every deployment of a comparison replays the *same* sequence, and every probe of a rate search replays the
same sequence at another rate (common random numbers): the sequence is generated from unit-rate points
``E_k`` mapped through the inverse of the cumulative intensity ``Λ(t) = ∫ m·r·c(s)·b(s) ds`` — base rate
``r``, rate curve ``c`` (diurnal), burst modulation ``b`` (on-off, generated once per seed) and the
multiplier ``m`` being searched. ``E_k`` are the points of a unit Poisson process (``poisson``,
``bursty``) or ``k + ½`` (``uniform``: deterministic intervals, the paper's model). Each request draws the
same five uniforms at every multiplier, so class, length and session choices line up across probes.

A trace replays recorded requests (arrival times divided by ``m``). Deterministic for a seed: every draw
comes from ``random.Random`` instances seeded here, never the global generator.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from ..capacity.workload import LengthDistribution, distribution_from_spec
from ..request.trace import TraceRecord
from .scenario import ArrivalSpec, RequestClassSpec, TimeCurveSpec


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request of the replayed sequence."""

    id: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    session: int
    shared_prefix_tokens: int
    klass: int = 0

    @property
    def uncached_tokens(self) -> int:
        """The request's incremental length: its prompt minus what it shares with its session's history."""
        return self.input_tokens - self.shared_prefix_tokens


class Curve:
    """A :class:`TimeCurveSpec` evaluated fast (piecewise linear, flat outside, optionally periodic)."""

    def __init__(self, spec: TimeCurveSpec | None, default: float = 1.0) -> None:
        pts = sorted((p.at_seconds, p.value) for p in spec.points) if spec is not None else [(0.0, default)]
        self._xs = [x for x, _ in pts]
        self._ys = [y for _, y in pts]
        self._period = spec.period_seconds if spec is not None else None

    def __call__(self, t: float) -> float:
        if self._period is not None:
            t = t % self._period
        xs, ys = self._xs, self._ys
        i = bisect.bisect_right(xs, t)
        if i == 0:
            return ys[0]
        if i == len(xs):
            return ys[-1]
        x0, x1 = xs[i - 1], xs[i]
        return ys[i - 1] + (ys[i] - ys[i - 1]) * (t - x0) / (x1 - x0)


def burst_switches(spec: ArrivalSpec, duration_s: float, seed: int) -> list[tuple[float, float]]:
    """``(start_s, multiplier)`` of the on-off bursts over ``[0, duration_s]`` (one per seed)."""
    if spec.process != "bursty":
        return [(0.0, 1.0)]
    rng = random.Random(seed * 7919 + 17)
    b = spec.burst
    out: list[tuple[float, float]] = []
    t, high = 0.0, rng.random() < b.mean_high_seconds / (b.mean_high_seconds + b.mean_low_seconds)
    while t < duration_s:
        out.append((t, b.high_multiplier if high else b.low_multiplier))
        t += rng.expovariate(1.0 / (b.mean_high_seconds if high else b.mean_low_seconds))
        high = not high
    return out


class Intensity:
    """The cumulative intensity ``Λ(t)`` at multiplier 1, tabulated at every second and burst switch."""

    def __init__(self, spec: ArrivalSpec, duration_s: float, seed: int) -> None:
        curve = Curve(spec.rate_curve)
        switches = burst_switches(spec, duration_s, seed)
        knots = sorted({float(k) for k in range(math.ceil(duration_s) + 1)} | {s for s, _ in switches})
        starts = [s for s, _ in switches]
        self._ts: list[float] = [knots[0]]
        self._cum: list[float] = [0.0]
        total = 0.0
        for a, b in itertools.pairwise(knots):
            mid = 0.5 * (a + b)
            burst = switches[bisect.bisect_right(starts, mid) - 1][1]
            total += spec.rate_per_second * curve(mid) * burst * (b - a)
            self._ts.append(b)
            self._cum.append(total)
        self.total = total

    def inverse(self, target: float) -> float:
        """The time at which ``Λ`` reaches ``target`` (inf past the end)."""
        cum = self._cum
        if target > self.total:
            return math.inf
        i = bisect.bisect_left(cum, target)
        if i == 0:
            return self._ts[0]
        c0, c1 = cum[i - 1], cum[i]
        t0, t1 = self._ts[i - 1], self._ts[i]
        return t0 + (t1 - t0) * (target - c0) / (c1 - c0) if c1 > c0 else t1

    def rate_at(self, t: float) -> float:
        """Mean intensity over the tabulation cell holding ``t``, req/s at multiplier 1."""
        i = min(max(bisect.bisect_right(self._ts, t), 1), len(self._ts) - 1)
        dt = self._ts[i] - self._ts[i - 1]
        return (self._cum[i] - self._cum[i - 1]) / dt if dt > 0 else 0.0


class _Session:
    __slots__ = ("context", "id", "last_s", "turns")

    def __init__(self, sid: int, context: int, last_s: float) -> None:
        self.id = sid
        self.context = context
        self.last_s = last_s
        self.turns = 1


def generate_requests(
    arrivals: ArrivalSpec,
    classes: Sequence[RequestClassSpec],
    duration_s: float,
    seed: int,
    rate_multiplier: float = 1.0,
) -> tuple[SimRequest, ...]:
    """The scenario's request sequence over ``[0, duration_s)`` at ``rate_multiplier`` × its rates."""
    if arrivals.process == "trace":
        raise ValueError("a trace scenario replays records: use requests_from_trace")
    if rate_multiplier <= 0:
        raise ValueError("rate_multiplier must be positive")
    intensity = Intensity(arrivals, duration_s, seed)
    dists: list[LengthDistribution] = [distribution_from_spec(c.input_length) for c in classes]
    curves = [Curve(c.weight_curve, c.weight) for c in classes]
    open_sessions: list[deque[_Session]] = [deque() for _ in classes]
    rng_points = random.Random(seed * 104_729 + 1)
    rng_req = random.Random(seed * 1_299_709 + 2)
    out: list[SimRequest] = []
    e = 0.0
    next_session = 0
    k = 0
    while True:
        e = e + rng_points.expovariate(1.0) if arrivals.process != "uniform" else k + 0.5
        t = intensity.inverse(e / rate_multiplier)
        if t >= duration_s:
            break
        u_cls, u_len, u_sess, u_div, u_cut = (rng_req.random() for _ in range(5))
        weights = [c(t) for c in curves]
        total = sum(weights)
        ci = 0
        if total > 0 and len(classes) > 1:
            acc, target = 0.0, u_cls * total
            for ci, w in enumerate(weights):  # noqa: B007 - the index after the loop is the choice
                acc += w
                if target < acc:
                    break
        cls = classes[ci]
        increment = max(1, dists[ci].sample(_Fixed(u_len)))
        session: _Session | None = None
        shared = 0
        spec = cls.sessions
        pool = open_sessions[ci]
        if (
            spec is not None
            and u_sess < spec.continue_probability
            and pool
            and pool[0].last_s <= t - spec.min_gap_seconds
        ):
            session = pool.popleft()
            shared = session.context
            if u_div < spec.diverge_probability:
                shared = int(u_cut * session.context)
            if shared + increment > spec.max_context_tokens:
                session = None  # the context would overflow: the session closes, a new one starts
                shared = 0
        if session is None:
            session = _Session(next_session, 0, t)
            next_session += 1
        input_tokens = shared + increment
        out.append(SimRequest(k, t, input_tokens, cls.output_tokens, session.id, shared, ci))
        k += 1
        if spec is not None:
            session.context = input_tokens + cls.output_tokens
            session.last_s = t
            session.turns += 1
            if session.turns <= spec.max_turns and session.context < spec.max_context_tokens:
                pool.append(session)
    return tuple(out)


class _Fixed:
    """A ``UniformSource`` returning one pre-drawn value (so a length uses the request's own uniform)."""

    __slots__ = ("_u",)

    def __init__(self, u: float) -> None:
        self._u = u

    def random(self) -> float:
        return self._u


def requests_from_trace(records: Sequence[TraceRecord], rate_multiplier: float = 1.0) -> tuple[SimRequest, ...]:
    """Replay a parsed trace; ``rate_multiplier`` compresses time (arrivals at ``arrival_s / m``)."""
    if rate_multiplier <= 0:
        raise ValueError("rate_multiplier must be positive")
    sessions: dict[str, int] = {}
    out = []
    for k, r in enumerate(records):
        sid = sessions.setdefault(r.session_id, len(sessions))
        out.append(
            SimRequest(k, r.arrival_s / rate_multiplier, r.input_tokens, r.output_tokens, sid, r.shared_prefix_tokens)
        )
    return tuple(out)


def to_trace_records(requests: Sequence[SimRequest]) -> tuple[TraceRecord, ...]:
    """The sequence in the project's trace format (``prfaas simulate --write-trace``)."""
    return tuple(
        TraceRecord(
            arrival_s=round(r.arrival_s, 6),
            input_tokens=r.input_tokens,
            output_tokens=r.output_tokens,
            session_id=f"s{r.session}",
            shared_prefix_tokens=r.shared_prefix_tokens,
        )
        for r in requests
    )
