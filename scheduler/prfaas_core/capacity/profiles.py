"""Shipped model profiles: the KV footprint (``S_kv``) of the models paper-spec §4 gives.

* ``internal-1t`` — the paper's case-study model (Table 5, measured: 1K 190.8 MiB, 8K 308.9 MiB,
  32K 701.3 MiB, 128K 2316.3 MiB).
* The rest by architecture, BF16 KV and FP32 recurrent state (paper-spec §4; sources listed there):
  ``kimi-linear-48b-a3b`` (7 MLA + 20 KDA), ``mimo-v2-flash`` (9 GA + 39 SWA/128), ``qwen3.5-397b-a17b``
  (15 GQA + 45 GDN), ``minimax-m2.5`` (62 GQA), ``qwen3-235b-a22b`` (94 GQA).

Linear-layer state per layer = heads × key dim × value dim × 4 B, plus a short-conv state of
3 (kernel − 1) × conv channels × 2 B — giving §4's ≈41 MiB (Kimi Linear) and ≈183 MiB (Qwen3.5).
"""

from __future__ import annotations

from ..api.model_profile import MeasuredKvPoint, MeasuredKvTable, ModelArchitecture, ModelProfileSpec, SlidingWindowSpec

_FP32 = 4
_BF16 = 2
_CONV_TAPS = 3  # kernel 4 keeps the last 3 inputs


def _linear_state_bytes(heads: int, key_dim: int, value_dim: int, conv_channels: int) -> int:
    return heads * key_dim * value_dim * _FP32 + _CONV_TAPS * conv_channels * _BF16


INTERNAL_1T = ModelProfileSpec(
    served_model_name="internal-1t",
    measured=MeasuredKvTable(
        points=[
            MeasuredKvPoint(length_tokens=1024, kv_mib=190.8),
            MeasuredKvPoint(length_tokens=8192, kv_mib=308.9),
            MeasuredKvPoint(length_tokens=32768, kv_mib=701.3),
            MeasuredKvPoint(length_tokens=131072, kv_mib=2316.3),
        ]
    ),
)

KIMI_LINEAR_48B = ModelProfileSpec(
    served_model_name="moonshotai/Kimi-Linear-48B-A3B-Instruct",
    architecture=ModelArchitecture(
        full_attention_layers=7,
        mla_latent_dim=512 + 64,  # kv_lora_rank + qk_rope_head_dim
        linear_layers=20,  # KDA, 32 heads × 128
        linear_state_bytes_per_layer=_linear_state_bytes(32, 128, 128, conv_channels=3 * 32 * 128),
    ),
)

MIMO_V2_FLASH = ModelProfileSpec(
    served_model_name="XiaomiMiMo/MiMo-V2-Flash",
    architecture=ModelArchitecture(
        full_attention_layers=9,  # 8 or 9 global-attention layers (paper-spec §4: low confidence); 9 here
        kv_heads=4,
        head_dim=192,
        value_head_dim=128,
        sliding_window=SlidingWindowSpec(layers=39, window_tokens=128, kv_heads=8, head_dim=192, value_head_dim=128),
    ),
)

QWEN35_397B = ModelProfileSpec(
    served_model_name="Qwen/Qwen3.5-397B-A17B",
    architecture=ModelArchitecture(
        full_attention_layers=15,
        kv_heads=2,
        head_dim=256,
        linear_layers=45,  # Gated DeltaNet: 16 QK heads, 64 V heads, dim 128
        linear_state_bytes_per_layer=_linear_state_bytes(64, 128, 128, conv_channels=2 * 16 * 128 + 64 * 128),
    ),
)

MINIMAX_M25 = ModelProfileSpec(
    served_model_name="MiniMaxAI/MiniMax-M2.5",
    architecture=ModelArchitecture(full_attention_layers=62, kv_heads=8, head_dim=128),
)

QWEN3_235B = ModelProfileSpec(
    served_model_name="Qwen/Qwen3-235B-A22B",
    architecture=ModelArchitecture(full_attention_layers=94, kv_heads=4, head_dim=128),
)

_PROFILES: dict[str, ModelProfileSpec] = {
    "internal-1t": INTERNAL_1T,
    "kimi-linear-48b-a3b": KIMI_LINEAR_48B,
    "mimo-v2-flash": MIMO_V2_FLASH,
    "qwen3.5-397b-a17b": QWEN35_397B,
    "minimax-m2.5": MINIMAX_M25,
    "qwen3-235b-a22b": QWEN3_235B,
}


def builtin_model_profiles() -> dict[str, ModelProfileSpec]:
    """The shipped profiles by name (a fresh dict; the specs themselves are frozen)."""
    return dict(_PROFILES)
