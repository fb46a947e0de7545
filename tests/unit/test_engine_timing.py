"""Service times from the core's hardware profiles, and the one scale setting engines and link share."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prfaas_core.capacity.hardware import builtin_hardware
from prfaas_core.launch.emulation import ScaleSettings
from prfaas_engine.config import ConfigError, EngineConfig, HostPort
from prfaas_engine.timing import ServiceTimes, chunk_ends

H200 = builtin_hardware("H200")
H20 = builtin_hardware("H20")
assert H200 is not None and H20 is not None


def test_prefill_follows_the_paper_table_for_h200() -> None:
    times = ServiceTimes(H200)
    assert times.prefill_s(8 * 1024) == pytest.approx(0.72)
    assert times.prefill_s(32 * 1024) == pytest.approx(1.84)
    assert times.prefill_s(0) == times.prefill_s(1)  # the last token is always computed


@given(st.integers(min_value=1, max_value=300_000), st.integers(min_value=512, max_value=20_000))
def test_chunked_prefill_adds_up_to_the_whole(uncached: int, chunk: int) -> None:
    times = ServiceTimes(H20)
    ends = chunk_ends(uncached, chunk)
    assert ends[-1] == uncached and all(b - a <= chunk for a, b in zip([0, *ends], ends, strict=False))
    total = sum(times.prefill_chunk_s(done, end) for done, end in zip([0, *ends[:-1]], ends, strict=True))
    assert total == pytest.approx(times.prefill_s(uncached), rel=1e-9)


def test_decode_step_is_the_slo_step_at_full_batch_and_grows_with_batch() -> None:
    times = ServiceTimes(H20)
    assert times.decode_step_s(20) == pytest.approx(0.025)
    steps = [times.decode_step_s(b) for b in range(1, 41)]
    assert steps == sorted(steps) and steps[0] < steps[-1]
    assert times.decode_step_s(0) == 0.0


def test_scale_converts_time_bytes_and_rates_consistently() -> None:
    s = ScaleSettings(time_scale=10, byte_scale=1e-3)
    assert s.wall_seconds(2.0) == pytest.approx(0.2)
    assert s.model_seconds(0.2) == pytest.approx(2.0)
    assert s.wire_bytes(701.3 * 2**20) == round(701.3 * 2**20 * 1e-3)
    assert s.wire_bytes(1) == 1 and s.wire_bytes(0) == 0
    # 100 Gbps = 12.5e9 B/s model; on the wire ×1e-3 bytes ×10 speed
    assert s.wire_rate_bytes_per_s(100) == pytest.approx(12.5e9 * 1e-3 * 10)
    assert s.model_gbps(s.wire_rate_bytes_per_s(13.0)) == pytest.approx(13.0)
    # a KV transfer takes the same model time whatever the scale
    model_bytes = 500e6
    wall = s.wire_bytes(model_bytes) / s.wire_rate_bytes_per_s(100)
    assert s.model_seconds(wall) == pytest.approx(model_bytes * 8 / 100e9, rel=1e-6)
    assert s.model_rate(50.0) == pytest.approx(5.0)


@pytest.mark.parametrize("bad", [0, -1, math.inf, math.nan])
def test_scale_rejects_non_positive_or_non_finite_values(bad: float) -> None:
    with pytest.raises(ValueError, match="time_scale"):
        ScaleSettings(time_scale=bad)
    with pytest.raises(ValueError, match="byte_scale"):
        ScaleSettings(byte_scale=bad)


def test_scale_parse() -> None:
    assert ScaleSettings.parse("time=10,bytes=0.5") == ScaleSettings(10, 0.5)
    assert ScaleSettings.parse("time=4") == ScaleSettings(time_scale=4)
    for bad in ("speed=2", "time=fast", "time"):
        with pytest.raises(ValueError, match="scale"):
            ScaleSettings.parse(bad)


def test_engine_config_defaults_and_errors() -> None:
    assert EngineConfig(role="prefill").hardware_profile.accelerator == "H200"
    assert EngineConfig(role="decode").hardware_profile.accelerator == "H20"
    assert EngineConfig(role="decode").batch_limit == 20  # H20's BS_max
    assert EngineConfig(model_profile="kimi-linear-48b-a3b").model_name == "kimi-linear-48b-a3b"
    with pytest.raises(ConfigError, match="hardware"):
        EngineConfig(hardware="TPU")
    with pytest.raises(ConfigError, match="model profile"):
        EngineConfig(model_profile="gpt-5")
    with pytest.raises(ConfigError, match="role"):
        EngineConfig(role="router")  # type: ignore[arg-type]
    assert HostPort.parse("127.0.0.1:9000") == HostPort("127.0.0.1", 9000)
    for bad in ("9000", "host:port", "h:70000"):
        with pytest.raises(ConfigError):
            HostPort.parse(bad)
