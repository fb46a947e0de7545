"""KV model (paper Eq. 1): S_kv from architectures and measured tables, Φ_kv, and the shipped profiles."""

from __future__ import annotations

import pytest

from prfaas_core.api import MeasuredKvPoint, MeasuredKvTable, ModelArchitecture, ModelProfileSpec
from prfaas_core.api.model_profile import SlidingWindowSpec
from prfaas_core.capacity.kv import KvModelError, kv_model_from_profile, whole_blocks
from prfaas_core.capacity.profiles import builtin_model_profiles
from prfaas_core.names import KIB, MIB
from prfaas_core.policy.routing import transfer_bytes

TABLE5 = [
    (1024, 190.8, 0.44, 3.61),
    (8192, 308.9, 0.72, 3.59),
    (32768, 701.3, 1.84, 3.19),
    (131072, 2316.3, 7.40, 2.62),
]


def _measured(points: list[tuple[int, float]]) -> ModelProfileSpec:
    return ModelProfileSpec(
        measured=MeasuredKvTable(points=[MeasuredKvPoint(length_tokens=n, kv_mib=m) for n, m in points])
    )


def test_measured_table_passes_through_its_points() -> None:
    kv = kv_model_from_profile(builtin_model_profiles()["internal-1t"])
    for length, mib, _, _ in TABLE5:
        assert kv.kv_bytes(length) == pytest.approx(mib * MIB)
    assert kv.source == "measured"


def test_measured_table_interpolates_linearly_and_extrapolates_past_the_ends() -> None:
    kv = kv_model_from_profile(_measured([(1000, 300.0), (2000, 500.0), (4000, 1300.0)]))
    assert kv.kv_bytes(1500) == pytest.approx(400.0 * MIB)
    assert kv.kv_bytes(3000) == pytest.approx(900.0 * MIB)
    assert kv.kv_bytes(5000) == pytest.approx(1700.0 * MIB)  # slope of the last segment
    assert kv.kv_bytes(500) == pytest.approx(200.0 * MIB)  # slope of the first segment


def test_measured_table_extrapolating_to_a_negative_size_is_rejected() -> None:
    with pytest.raises(KvModelError, match="negative KV size"):
        kv_model_from_profile(_measured([(1000, 100.0), (2000, 300.0)]))


def test_measured_table_summary_is_the_papers_fit() -> None:
    # paper-spec §3.3: S_kv(l) = 172.0 MiB + 16.74 KiB·l (least squares on Table 5)
    kv = kv_model_from_profile(builtin_model_profiles()["internal-1t"])
    assert kv.fixed_bytes / MIB == pytest.approx(172.0, abs=0.5)
    assert kv.bytes_per_token / KIB == pytest.approx(16.74, abs=0.02)


@pytest.mark.parametrize(("length", "mib", "seconds", "gbps"), TABLE5)
def test_kv_throughput_reproduces_table5(length: int, mib: float, seconds: float, gbps: float) -> None:
    kv = kv_model_from_profile(builtin_model_profiles()["internal-1t"])
    # Table 5's own rounding: 190.8 MiB in 0.44 s is 3.64 Gbps against the stated 3.61
    assert kv.kv_throughput_gbps(length, seconds) == pytest.approx(gbps, rel=0.01)


def test_kv_throughput_needs_a_positive_time() -> None:
    kv = kv_model_from_profile(builtin_model_profiles()["minimax-m2.5"])
    with pytest.raises(ValueError, match="positive"):
        kv.kv_throughput_gbps(1024, 0.0)


def test_measured_table_that_shrinks_is_rejected_naming_the_field() -> None:
    with pytest.raises(KvModelError, match=r"spec\.measured\.points"):
        kv_model_from_profile(_measured([(1000, 300.0), (2000, 100.0)]))


def test_gqa_counts_k_and_v_per_layer() -> None:
    arch = ModelArchitecture(full_attention_layers=62, kv_heads=8, head_dim=128)
    kv = kv_model_from_profile(ModelProfileSpec(architecture=arch))
    assert kv.bytes_per_token == 62 * 2 * 8 * 128 * 2 == 253_952
    assert kv.fixed_bytes == 0
    assert kv.kv_bytes(1000) == pytest.approx(253_952_000)


def test_value_head_dim_and_dtype_are_used() -> None:
    arch = ModelArchitecture(full_attention_layers=2, kv_heads=4, head_dim=192, value_head_dim=128, kv_dtype="fp8")
    kv = kv_model_from_profile(ModelProfileSpec(architecture=arch))
    assert kv.bytes_per_token == 2 * 4 * (192 + 128) * 1


def test_mla_uses_one_latent_per_token_and_linear_state_is_fixed() -> None:
    arch = ModelArchitecture(
        full_attention_layers=7, mla_latent_dim=576, linear_layers=20, linear_state_bytes_per_layer=1000
    )
    kv = kv_model_from_profile(ModelProfileSpec(architecture=arch))
    assert kv.bytes_per_token == 7 * 576 * 2
    assert kv.kv_bytes(0) == 20_000
    assert kv.kv_bytes(10) == pytest.approx(20_000 + 10 * 8064)


def test_sliding_window_grows_until_the_window_then_stays_flat() -> None:
    arch = ModelArchitecture(
        full_attention_layers=1,
        kv_heads=1,
        head_dim=4,
        sliding_window=SlidingWindowSpec(layers=2, window_tokens=100, kv_heads=1, head_dim=4),
    )
    kv = kv_model_from_profile(ModelProfileSpec(architecture=arch))
    full, swa = 1 * 1 * 8 * 2, 2 * 1 * 8 * 2
    assert kv.kv_bytes(50) == pytest.approx(50 * (full + swa))
    assert kv.kv_bytes(100) == pytest.approx(100 * (full + swa))
    assert kv.kv_bytes(1000) == pytest.approx(1000 * full + 100 * swa)
    assert kv.kv_bytes(10_000) == pytest.approx(10_000 * full + 100 * swa)
    assert kv.fixed_bytes == 100 * swa


def test_architecture_estimate_of_the_1t_model_matches_table5() -> None:
    # paper-spec §4: 15 MLA + 45 KDA (64 heads × 128 × 128 × fp32) predicts 197/315/720/2340 MiB
    arch = ModelArchitecture(
        full_attention_layers=15, mla_latent_dim=576, linear_layers=45, linear_state_bytes_per_layer=64 * 128 * 128 * 4
    )
    kv = kv_model_from_profile(ModelProfileSpec(architecture=arch))
    for length, mib, _, _ in TABLE5:
        assert kv.kv_bytes(length) / MIB == pytest.approx(mib, rel=0.035)


# Table 3 (Φ_kv, Gbps, at 1K/8K/32K/128K) and paper-spec §4's implied T_prefill (s) per model.
TABLE3 = {
    "kimi-linear-48b-a3b": ((1.19, 2.29, 3.87, 4.88), (0.35, 0.38, 0.64, 1.80)),
    "mimo-v2-flash": ((0.82, 2.85, 4.66, 4.71), (0.48, 0.60, 1.34, 5.17)),
    "qwen3.5-397b-a17b": ((4.13, 6.28, 8.25, 7.47), (0.43, 0.57, 1.16, 4.52)),
    "minimax-m2.5": ((4.94, 32.87, 59.93, 47.82), (0.42, 0.51, 1.11, 5.57)),
    "qwen3-235b-a22b": ((4.12, 22.42, 33.35, 21.50), (0.38, 0.56, 1.51, 9.39)),
}


@pytest.mark.parametrize("name", sorted(TABLE3))
def test_shipped_profiles_are_consistent_with_table3(name: str) -> None:
    kv = kv_model_from_profile(builtin_model_profiles()[name])
    phis, seconds = TABLE3[name]
    for k, phi, t in zip((1, 8, 32, 128), phis, seconds, strict=True):
        assert kv.kv_throughput_gbps(k * 1024, t) == pytest.approx(phi, rel=0.02), f"{name} at {k}K"


def test_shipped_profiles_state_sizes_match_paper_spec_section_4() -> None:
    profiles = {n: kv_model_from_profile(p) for n, p in builtin_model_profiles().items()}
    assert profiles["kimi-linear-48b-a3b"].bytes_per_token == 8064
    assert profiles["kimi-linear-48b-a3b"].fixed_bytes / MIB == pytest.approx(41, abs=1)
    assert profiles["mimo-v2-flash"].bytes_per_token == 23_040
    assert profiles["mimo-v2-flash"].fixed_bytes / MIB == pytest.approx(24, abs=0.5)
    assert profiles["qwen3.5-397b-a17b"].bytes_per_token == 30_720
    assert profiles["qwen3.5-397b-a17b"].fixed_bytes / MIB == pytest.approx(183, abs=1)
    assert profiles["qwen3-235b-a22b"].bytes_per_token == 192_512
    assert set(profiles) == {
        "internal-1t",
        "kimi-linear-48b-a3b",
        "mimo-v2-flash",
        "qwen3.5-397b-a17b",
        "minimax-m2.5",
        "qwen3-235b-a22b",
    }


def test_builtin_profiles_round_trip_through_the_api_models() -> None:
    for spec in builtin_model_profiles().values():
        again = ModelProfileSpec.model_validate(spec.to_manifest())
        assert again == spec


def test_transfers_count_whole_blocks_where_the_block_size_is_known() -> None:
    """An engine holds and moves whole KV blocks (vLLM's NixlConnector reads block descriptors): with the block
    size known (the routers' prefixBlockTokens) a transfer of n tokens is S_kv of ceil(n/b)*b tokens."""
    tiny = {"architecture": {"fullAttentionLayers": 2, "kvHeads": 2, "headDim": 32, "kvDtype": "bf16"}}
    kv = kv_model_from_profile(ModelProfileSpec.model_validate(tiny))
    assert kv.block_kv_bytes(129) == kv.kv_bytes(129) == 512 * 129  # block size unknown: tokens
    blocks = kv.with_blocks(128)
    assert [whole_blocks(n, 128) for n in (0, 1, 128, 129)] == [0, 1, 1, 2]
    assert blocks.block_kv_bytes(129) == 512 * 256 and blocks.block_kv_bytes(128) == 512 * 128
    assert blocks.kv_bytes(129) == 512 * 129  # S_kv itself is unchanged (the planner's and the threshold's)
    # the decode holds 256 cached tokens (two blocks): the rest of a 300-token prompt is one whole block
    assert transfer_bytes(blocks, 300, 256) == 512 * 128
    assert transfer_bytes(blocks, 300, 0) == 512 * 384
