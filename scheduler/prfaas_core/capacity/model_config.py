"""A ModelProfile from a model's own configuration (Hugging Face ``config.json``, as parsed JSON) and the engine's
KV block size: the KV geometry the engine holds and moves, computed as vLLM 0.32 lays it out. Pure: no I/O
(``prfaas profile`` reads the file and checks the result against a served engine's transferred bytes).

* full-attention layers: ``kv_heads x (head_dim + head_dim) x dtype`` bytes per token and layer (K and V);
* linear-attention layers (a hybrid): a fixed recurrent state per request and layer. Gated DeltaNet (Qwen3-Next):
  a conv state of ``(conv_kernel - 1) x (2 x key_heads x key_dim + value_heads x value_dim)`` in the model's
  dtype plus a recurrent state of ``value_heads x key_dim x value_dim`` in the state dtype (vLLM's CPU backend
  keeps it in fp32; on GPUs it is the model's dtype unless ``--mamba-ssm-cache-dtype`` says otherwise); Mamba2
  (Granite-4-H): a conv state of ``(d_conv - 1) x (expand x hidden + 2 x groups x d_state)`` plus an SSM state of
  ``heads x head_dim x d_state``;
* the block: vLLM enlarges a hybrid's attention block (in multiples of the configured block size) until one
  layer's attention page holds one layer's recurrent state, so the KV moves in whole blocks of that size (the tiny
  Qwen3-Next on CPU: 128 configured, 256 used).

A decode side pulls ``ceil((N-1)/B)`` attention blocks plus the state for a hybrid (``KvModel.pulled_kv_bytes``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..api.model_profile import KvDtype, ModelArchitecture
from .kv import DTYPE_BYTES, full_attention_bytes_per_token_per_layer

TORCH_DTYPES: Mapping[str, KvDtype] = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float": "fp32"}

DENSE_ARCHITECTURES = frozenset(
    {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "GraniteForCausalLM"}
)
GDN_ARCHITECTURES = frozenset({"Qwen3NextForCausalLM"})
MAMBA2_ARCHITECTURES = frozenset({"GraniteMoeHybridForCausalLM"})
SUPPORTED = ", ".join(sorted(DENSE_ARCHITECTURES | GDN_ARCHITECTURES | MAMBA2_ARCHITECTURES))


class ModelConfigError(ValueError):
    """A configuration this module cannot read a KV geometry from; the message names the field."""


def _int(config: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ModelConfigError(f"config.json: {key} must be a non-negative integer, got {value!r}")
    return value


def model_dtype(config: Mapping[str, Any]) -> KvDtype:
    """The checkpoint's dtype (``dtype``, or ``torch_dtype`` in older files) as a KV dtype."""
    raw = config.get("dtype") or config.get("torch_dtype") or "bfloat16"
    if raw not in TORCH_DTYPES:
        raise ModelConfigError(f"config.json: dtype {raw!r} is not one of {', '.join(TORCH_DTYPES)}")
    return TORCH_DTYPES[raw]


def _layer_types(config: Mapping[str, Any], layers: int) -> list[str]:
    types = config.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        return [str(t) for t in types]
    interval = _int(config, "full_attention_interval", 4)
    if interval < 1:
        raise ModelConfigError("config.json: full_attention_interval must be >= 1")
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]


def gdn_state_bytes(config: Mapping[str, Any], state_dtype: KvDtype) -> int:
    """One gated-DeltaNet layer's state per request: conv state (model dtype) + recurrent state (``state_dtype``)."""
    key_heads, value_heads = _int(config, "linear_num_key_heads"), _int(config, "linear_num_value_heads")
    key_dim, value_dim = _int(config, "linear_key_head_dim"), _int(config, "linear_value_head_dim")
    kernel = _int(config, "linear_conv_kernel_dim", 4)
    conv = max(kernel - 1, 0) * (2 * key_heads * key_dim + value_heads * value_dim) * DTYPE_BYTES[model_dtype(config)]
    return conv + value_heads * key_dim * value_dim * DTYPE_BYTES[state_dtype]


def mamba2_state_bytes(config: Mapping[str, Any], state_dtype: KvDtype) -> int:
    """One Mamba2 layer's state per request: conv state ``(d_conv - 1) x (expand x hidden + 2 x groups x d_state)``
    (model dtype) + SSM state ``heads x head_dim x d_state`` (``state_dtype``), as vLLM's ``mamba2_state_shape``."""
    hidden, expand = _int(config, "hidden_size"), _int(config, "mamba_expand", 2)
    groups, d_state = _int(config, "mamba_n_groups", 1), _int(config, "mamba_d_state")
    conv_dim = expand * hidden + 2 * groups * d_state
    conv = max(_int(config, "mamba_d_conv", 4) - 1, 0) * conv_dim * DTYPE_BYTES[model_dtype(config)]
    return conv + _int(config, "mamba_n_heads") * _int(config, "mamba_d_head") * d_state * DTYPE_BYTES[state_dtype]


def engine_block_tokens(block_size: int, attention_bytes_per_token_layer: int, state_bytes_layer: int) -> int:
    """The block vLLM uses: ``block_size`` for a dense model; for a hybrid the smallest multiple of it whose
    attention page (one layer) holds one layer's recurrent state."""
    if block_size < 1:
        raise ModelConfigError(f"block size must be >= 1, got {block_size}")
    if state_bytes_layer <= 0 or attention_bytes_per_token_layer <= 0:
        return block_size
    return block_size * max(1, math.ceil(state_bytes_layer / (block_size * attention_bytes_per_token_layer)))


def architecture_from_config(
    config: Mapping[str, Any], block_size: int, state_dtype: KvDtype = "fp32"
) -> ModelArchitecture:
    """The KV geometry of the model ``config`` describes, served with ``--block-size block_size``."""
    names = config.get("architectures") or []
    arch = names[0] if isinstance(names, list) and names else None
    if arch not in DENSE_ARCHITECTURES | GDN_ARCHITECTURES | MAMBA2_ARCHITECTURES:
        raise ModelConfigError(f"config.json: architectures {names!r}: supported are {SUPPORTED}")
    layers = _int(config, "num_hidden_layers")
    heads = _int(config, "num_attention_heads")
    kv_heads = _int(config, "num_key_value_heads", heads)
    head_dim = config.get("head_dim") or (_int(config, "hidden_size") // max(heads, 1))
    dtype = model_dtype(config)
    fields: dict[str, Any] = {"kv_heads": kv_heads, "head_dim": int(head_dim), "kv_dtype": dtype}
    if arch in GDN_ARCHITECTURES | MAMBA2_ARCHITECTURES:
        types = _layer_types(config, layers)
        full, linear = types.count("full_attention"), types.count("linear_attention")
        gdn = arch in GDN_ARCHITECTURES
        state = gdn_state_bytes(config, state_dtype) if gdn else mamba2_state_bytes(config, state_dtype)
        fields |= {
            "full_attention_layers": full,
            "linear_layers": linear,
            "linear_state_bytes_per_layer": state,
            "linear_kind": "GatedDeltaNet" if gdn else "Mamba2",
        }
    else:
        full, state = layers, 0
        fields["full_attention_layers"] = layers
    probe = ModelArchitecture(
        full_attention_layers=max(full, 1), kv_heads=kv_heads, head_dim=int(head_dim), kv_dtype=dtype
    )
    per_layer = full_attention_bytes_per_token_per_layer(probe)
    fields["block_tokens"] = engine_block_tokens(block_size, per_layer, state)
    return ModelArchitecture(**fields)
