"""Hardware profiles: prefill latency vs uncached length, and decode capacity at the SLO, per instance.

Built-in profiles by accelerator class (one instance = 8 GPUs, as in every experiment of the paper):

* **H200** — through the paper's Table 5 points (K = 1024 tokens): 1K → 0.44 s, 8K → 0.72 s, 32K → 1.84 s,
  128K → 7.40 s (paper-spec §3.3), interpolated log-log (a power law between neighbouring points), held as a
  fine piecewise-linear curve (16 knots per interval) and extended linearly past the ends. Why not plain
  chords: the paper's naive-heterogeneous baseline (Table 6, Θ = 4/T(E[L]) = 2.45 req/s) implies
  T(27.5K) = 1.633 s; the power law gives 1.635 s, the chord 1.599 s. Both give T(62.3K) = 3.51 s (the P90
  TTFT). With chords the naive mean TTFT comes out 1.687 s, 3.05 % under the paper's 1.74; with the power
  law 1.714 s. A manifest's ``prefillTime.points`` are interpolated with plain chords, as the API says.
* **H20** — the fit ``T(l) = 0.468 + 1.3007e-4·l + 2.975e-10·l²`` s reconstructed from Table 6
  (paper-spec §3.6), and decode ``BS_max = 20`` streams at ``T_decode = 25 ms`` (800 output tokens/s,
  the 40 tok/s SLO).

A :class:`~prfaas_core.api.HardwareSpec` names the class and may override ``prefillTime`` (points or a
polynomial) and ``decode``; :func:`hardware_from_spec` applies them, and fails with
:class:`HardwareProfileError` naming the field when an unknown class has no override.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..api.hardware import HardwareSpec, PrefillTimeSpec
from ..names import K_TOKENS
from .curves import PiecewisePolynomial


class HardwareProfileError(ValueError):
    """A hardware spec that cannot give a profile; the message names the field."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field_path = field_path


@dataclass(frozen=True)
class DecodeCapacity:
    """Decode capacity of one instance at the SLO: ``max_batch_size`` streams, one step per ``step_time_s``."""

    max_batch_size: int
    step_time_s: float

    @property
    def tokens_per_second(self) -> float:
        """``BS_max / T_decode``: output tokens per second of one instance."""
        return self.max_batch_size / self.step_time_s

    def requests_per_second(self, output_tokens: float) -> float:
        """``BS_max / (T_decode·L_out)``: requests per second one instance decodes (paper Eq. 5)."""
        return self.tokens_per_second / output_tokens


@dataclass(frozen=True)
class HardwareProfile:
    """Everything the planner needs about one instance of an accelerator class."""

    accelerator: str
    prefill_curve: PiecewisePolynomial
    decode: DecodeCapacity | None
    gpus_per_instance: int = 8
    price_per_instance_hour: float | None = None
    description: str = ""

    def prefill_seconds(self, length_tokens: float) -> float:
        """``T_prefill(l)``: prefill latency of one instance for ``l`` uncached tokens, seconds."""
        return self.prefill_curve(length_tokens)


_H200_POINTS = ((1 * K_TOKENS, 0.44), (8 * K_TOKENS, 0.72), (32 * K_TOKENS, 1.84), (128 * K_TOKENS, 7.40))
"""Paper Table 5: prefill latency of one 8×H200 instance of the internal 1T model, (tokens, seconds)."""


def log_log_knots(points: Sequence[tuple[float, float]], per_interval: int = 16) -> list[tuple[float, float]]:
    """Knots on the power law ``y = y0·(x/x0)^a`` through each pair of neighbouring points (which stay knots)."""
    pts = sorted(points)
    knots: list[tuple[float, float]] = []
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        exponent = math.log(y1 / y0) / math.log(x1 / x0)
        for i in range(per_interval):
            x = x0 * (x1 / x0) ** (i / per_interval)
            knots.append((x, y0 * (x / x0) ** exponent))
    knots.append(pts[-1])
    return knots


_BUILTIN: dict[str, HardwareProfile] = {
    "H200": HardwareProfile(
        accelerator="H200",
        prefill_curve=PiecewisePolynomial.through_points(log_log_knots([(float(x), y) for x, y in _H200_POINTS])),
        # [E] not in the paper (PrFaaS never decodes): ~1.2× H20's memory bandwidth -> 24 streams at 25 ms.
        decode=DecodeCapacity(max_batch_size=24, step_time_s=0.025),
        description="8×H200; prefill through paper Table 5 (1K 0.44 s, 8K 0.72 s, 32K 1.84 s, 128K 7.40 s), "
        "log-log interpolated; decode an estimate (24 streams at 25 ms)",
    ),
    "H20": HardwareProfile(
        accelerator="H20",
        prefill_curve=PiecewisePolynomial.polynomial(0.468, 1.3007e-4, 2.975e-10),
        decode=DecodeCapacity(max_batch_size=20, step_time_s=0.025),
        description="8×H20; prefill 0.468 + 1.3007e-4·l + 2.975e-10·l² s (fit to paper Table 6); decode "
        "20 streams at 25 ms = 800 tok/s (40 tok/s SLO)",
    ),
}


def list_builtin_hardware() -> tuple[HardwareProfile, ...]:
    """The built-in profiles, by name (for ``prfaas plan --list-hardware``)."""
    return tuple(_BUILTIN[name] for name in sorted(_BUILTIN))


def builtin_hardware(accelerator: str) -> HardwareProfile | None:
    """The built-in profile of an accelerator class (case-insensitive), or None."""
    for name, profile in _BUILTIN.items():
        if name.lower() == accelerator.lower():
            return profile
    return None


def prefill_curve_from_spec(spec: PrefillTimeSpec, field_path: str) -> PiecewisePolynomial:
    """The latency curve a ``prefillTime`` override describes; it must never decrease with length."""
    if spec.polynomial is not None:
        poly = spec.polynomial
        curve = PiecewisePolynomial.polynomial(
            poly.c0_seconds, poly.c1_seconds_per_token, poly.c2_seconds_per_token_squared
        )
        if curve(1.0) <= 0:
            raise HardwareProfileError(f"{field_path}.polynomial", "the latency must be positive")
        return curve
    if spec.points is None:
        raise HardwareProfileError(field_path, "set exactly one of points or polynomial")
    points = sorted((float(p.length_tokens), p.seconds) for p in spec.points)
    if any(b[1] < a[1] for a, b in itertools.pairwise(points)):
        raise HardwareProfileError(
            f"{field_path}.points", "seconds must not decrease as lengthTokens grows (prefill gets no faster)"
        )
    curve = PiecewisePolynomial.through_points(points)
    if curve(1.0) <= 0:
        raise HardwareProfileError(
            f"{field_path}.points",
            "extrapolating below the shortest point gives a non-positive latency; add a shorter point",
        )
    return curve


def hardware_from_spec(spec: HardwareSpec, field_path: str = "spec.hardware") -> HardwareProfile:
    """The profile of a cluster's hardware: the built-in class with the spec's overrides applied.

    ``field_path`` prefixes error messages (e.g. ``spec.hardware`` of a PDCluster).
    """
    base = builtin_hardware(spec.accelerator)
    prefill_path = f"{field_path}.prefillTime"
    if spec.prefill_time is not None:
        curve = prefill_curve_from_spec(spec.prefill_time, prefill_path)
    elif base is not None:
        curve = base.prefill_curve
    else:
        known = ", ".join(p.accelerator for p in list_builtin_hardware())
        raise HardwareProfileError(
            f"{field_path}.accelerator",
            f"{spec.accelerator!r} has no built-in profile (built-in: {known}); set {prefill_path}",
        )
    decode: DecodeCapacity | None = base.decode if base is not None else None
    if spec.decode is not None:
        decode = DecodeCapacity(spec.decode.max_batch_size, spec.decode.step_time_ms / 1000.0)
    overridden = spec.prefill_time is not None or spec.decode is not None
    description = base.description if base is not None else f"custom {spec.accelerator}"
    profile = HardwareProfile(
        accelerator=base.accelerator if base is not None else spec.accelerator,
        prefill_curve=curve,
        decode=decode,
        description=description + (" (overridden by the manifest)" if overridden and base is not None else ""),
    )
    return replace(
        profile, gpus_per_instance=spec.gpus_per_instance, price_per_instance_hour=spec.price_per_instance_hour
    )
