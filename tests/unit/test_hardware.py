"""Hardware profiles: built-in H200/H20 curves, decode capacity, manifest overrides and their errors."""

from __future__ import annotations

import pytest

from prfaas_core.api import DecodeCapacitySpec, HardwareSpec, PrefillPolynomial, PrefillTimePoint, PrefillTimeSpec
from prfaas_core.capacity.hardware import (
    HardwareProfileError,
    builtin_hardware,
    hardware_from_spec,
    list_builtin_hardware,
)

K = 1024


def _points(*pairs: tuple[int, float]) -> PrefillTimeSpec:
    return PrefillTimeSpec(points=[PrefillTimePoint(length_tokens=n, seconds=s) for n, s in pairs])


@pytest.mark.parametrize(("length", "seconds"), [(1 * K, 0.44), (8 * K, 0.72), (32 * K, 1.84), (128 * K, 7.40)])
def test_h200_passes_through_table5(length: int, seconds: float) -> None:
    h200 = hardware_from_spec(HardwareSpec(accelerator="H200"))
    assert h200.prefill_seconds(length) == pytest.approx(seconds, abs=1e-9)


def test_h200_between_the_points_matches_what_table6_implies() -> None:
    h200 = hardware_from_spec(HardwareSpec(accelerator="H200"))
    # naive heterogeneous: 4 / T(E[L] = 27,486) = 2.45 req/s -> T = 1.633 s (a chord would give 1.599 s)
    assert h200.prefill_seconds(27_486) == pytest.approx(4 / 2.45, rel=0.005)
    # P90 TTFT 3.51 s at the P90 length 62.3K tokens
    assert h200.prefill_seconds(62_324) == pytest.approx(3.51, abs=0.01)


def test_h200_is_increasing_and_linear_past_the_last_point() -> None:
    curve = hardware_from_spec(HardwareSpec(accelerator="H200")).prefill_curve
    assert curve.is_nondecreasing_from(0)
    a, b, c = curve(160 * K), curve(200 * K), curve(240 * K)
    assert b - a == pytest.approx(c - b)
    assert curve(128) > 0


def test_h20_fit_reproduces_the_constraints_derived_from_table6() -> None:
    h20 = hardware_from_spec(HardwareSpec(accelerator="H20"))
    assert h20.prefill_seconds(10_224) == pytest.approx(3 / 1.64, rel=0.01)  # PD-P at l_short
    assert h20.prefill_seconds(27_486) == pytest.approx(9 / 2.11, rel=0.01)  # homogeneous at E[L]
    assert h20.prefill_seconds(62_324) == pytest.approx(9.73, rel=0.005)  # homogeneous P90 TTFT


def test_h20_decode_is_800_tokens_per_second() -> None:
    decode = hardware_from_spec(HardwareSpec(accelerator="H20")).decode
    assert decode is not None
    assert (decode.max_batch_size, decode.step_time_s) == (20, 0.025)
    assert decode.tokens_per_second == pytest.approx(800)
    assert decode.requests_per_second(1024) == pytest.approx(0.78125)


def test_builtin_lookup_is_case_insensitive_and_listed() -> None:
    assert builtin_hardware("h200") is builtin_hardware("H200")
    assert builtin_hardware("B300") is None
    names = [p.accelerator for p in list_builtin_hardware()]
    assert names == sorted(names)
    assert {"H200", "H20"} <= set(names)
    assert all(p.decode is not None and p.description for p in list_builtin_hardware())


def test_points_override_is_piecewise_linear_with_linear_extrapolation() -> None:
    spec = HardwareSpec(accelerator="H20", prefill_time=_points((2000, 2.0), (1000, 1.0), (3000, 5.0)))
    hw = hardware_from_spec(spec)
    assert hw.prefill_seconds(1500) == pytest.approx(1.5)
    assert hw.prefill_seconds(2500) == pytest.approx(3.5)
    assert hw.prefill_seconds(4000) == pytest.approx(8.0)
    assert hw.prefill_seconds(500) == pytest.approx(0.5)
    assert hw.decode == builtin_hardware("H20").decode  # type: ignore[union-attr]
    assert "overridden" in hw.description


def test_polynomial_and_decode_overrides_and_price() -> None:
    spec = HardwareSpec(
        accelerator="MI300X",
        gpus_per_instance=4,
        prefill_time=PrefillTimeSpec(
            polynomial=PrefillPolynomial(c0_seconds=0.5, c1_seconds_per_token=1e-4, c2_seconds_per_token_squared=1e-10)
        ),
        decode=DecodeCapacitySpec(max_batch_size=32, step_time_ms=40),
        price_per_instance_hour=12.5,
    )
    hw = hardware_from_spec(spec)
    assert hw.accelerator == "MI300X"
    assert hw.prefill_seconds(10_000) == pytest.approx(0.5 + 1.0 + 0.01)
    assert hw.decode is not None and hw.decode.tokens_per_second == pytest.approx(800)
    assert (hw.gpus_per_instance, hw.price_per_instance_hour) == (4, 12.5)


def test_unknown_accelerator_without_override_names_the_field() -> None:
    with pytest.raises(HardwareProfileError) as err:
        hardware_from_spec(HardwareSpec(accelerator="X9"), "PDCluster spec.hardware")
    message = str(err.value)
    assert "PDCluster spec.hardware.accelerator" in message
    assert "'X9' has no built-in profile" in message
    assert "spec.hardware.prefillTime" in message
    assert err.value.field_path == "PDCluster spec.hardware.accelerator"


def test_unknown_accelerator_with_prefill_override_has_no_decode() -> None:
    hw = hardware_from_spec(HardwareSpec(accelerator="X9", prefill_time=_points((1000, 1.0), (2000, 2.0))))
    assert hw.decode is None
    assert hw.prefill_seconds(1000) == pytest.approx(1.0)


def test_prefill_points_that_get_faster_are_rejected() -> None:
    spec = HardwareSpec(accelerator="H200", prefill_time=_points((1000, 2.0), (2000, 1.0)))
    with pytest.raises(HardwareProfileError, match=r"spec\.hardware\.prefillTime\.points: seconds must not decrease"):
        hardware_from_spec(spec)


def test_prefill_points_extrapolating_to_zero_are_rejected() -> None:
    spec = HardwareSpec(accelerator="H200", prefill_time=_points((1000, 0.1), (2000, 2.0)))
    with pytest.raises(HardwareProfileError, match="non-positive latency"):
        hardware_from_spec(spec)
