"""ModelProfile: how many KV bytes a request of a given length produces (``S_kv(l)``, paper Eq. 1).

Either an *architecture* (layers, heads, dims, dtype; paper-spec.md §4's formula) or a *measured* table
(like the paper's Table 5). Structural schemas allow no free ``oneOf``, so both are optional fields and a
CEL rule requires exactly one.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from ..names import GROUP_VERSION, KIND_MODEL_PROFILE
from .base import ApiModel, CelRule, Condition, ObjectMeta, conditions_field

KvDtype = Literal["fp32", "bf16", "fp16", "fp8"]
LinearKind = Literal["GatedDeltaNet", "Mamba2", "KDA"]
"""The recurrent layer of a hybrid model: Qwen3-Next's and Qwen3.5's gated DeltaNet, Granite-4-H's and Nemotron-H's
Mamba2, Kimi Linear's KDA. The engines' flags depend on it (``prfaas_core.launch``)."""


class SlidingWindowSpec(ApiModel):
    """Sliding-window attention layers: KV grows with length up to the window, then stays flat."""

    layers: int = Field(ge=1, le=10_000, description="Number of sliding-window layers.")
    window_tokens: int = Field(ge=1, le=10_000_000, description="Window size, in tokens.")
    kv_heads: int = Field(ge=1, le=4096, description="KV heads per sliding-window layer.")
    head_dim: int = Field(ge=1, le=65_536, description="Key head dimension.")
    value_head_dim: int | None = Field(
        default=None, ge=1, le=65_536, description="Value head dimension (defaults to headDim)."
    )


class ModelArchitecture(ApiModel):
    """Architecture parameters that determine KV size: ``S_kv(l) = l * perToken + fixedState``."""

    __cel_rules__ = (
        CelRule(
            rule="!has(self.kvHeads) || !has(self.mlaLatentDim)",
            message="set kvHeads and headDim (GQA/MHA) or mlaLatentDim (MLA), not both",
            check=lambda a: a.kv_heads is None or a.mla_latent_dim is None,
            field_path=".mlaLatentDim",
        ),
        CelRule(
            rule="has(self.kvHeads) == has(self.headDim)",
            message="kvHeads and headDim must be set together",
            check=lambda a: (a.kv_heads is None) == (a.head_dim is None),
            field_path=".headDim",
        ),
        CelRule(
            rule="self.fullAttentionLayers == 0 || has(self.kvHeads) || has(self.mlaLatentDim)",
            message="full-attention layers need kvHeads and headDim (GQA/MHA) or mlaLatentDim (MLA)",
            check=lambda a: a.full_attention_layers == 0 or a.kv_heads is not None or a.mla_latent_dim is not None,
            field_path=".kvHeads",
        ),
        CelRule(
            rule="self.linearLayers == 0 || self.linearStateBytesPerLayer > 0",
            message="linear-attention layers need linearStateBytesPerLayer > 0",
            check=lambda a: a.linear_layers == 0 or a.linear_state_bytes_per_layer > 0,
            field_path=".linearStateBytesPerLayer",
        ),
        CelRule(
            rule="!has(self.linearKind) || self.linearLayers > 0",
            message="linearKind needs linearLayers > 0",
            check=lambda a: a.linear_kind is None or a.linear_layers > 0,
            field_path=".linearKind",
        ),
        CelRule(
            rule="self.fullAttentionLayers + self.linearLayers + (has(self.slidingWindow) ? "
            "self.slidingWindow.layers : 0) > 0",
            message="the model needs at least one layer (full-attention, linear or sliding-window)",
            check=lambda a: (
                a.full_attention_layers + a.linear_layers + (a.sliding_window.layers if a.sliding_window else 0) > 0
            ),
            field_path=".fullAttentionLayers",
        ),
    )

    full_attention_layers: int = Field(ge=0, le=10_000, description="Layers with full attention (GQA/MHA/MLA).")
    kv_heads: int | None = Field(default=None, ge=1, le=4096, description="KV heads per full-attention layer.")
    head_dim: int | None = Field(default=None, ge=1, le=65_536, description="Key head dimension.")
    value_head_dim: int | None = Field(
        default=None, ge=1, le=65_536, description="Value head dimension (defaults to headDim)."
    )
    mla_latent_dim: int | None = Field(
        default=None,
        ge=1,
        le=65_536,
        description="MLA compressed KV width per token (kv_lora_rank + rope dim).",
    )
    kv_dtype: KvDtype = Field(default="bf16", description="Data type of the KV cache.")
    linear_layers: int = Field(default=0, ge=0, le=10_000, description="Linear-attention (KDA/GDN/Mamba) layers.")
    linear_state_bytes_per_layer: int = Field(
        default=0,
        ge=0,
        le=1 << 40,
        description="Recurrent state of one linear layer per request, in bytes (heads x key dim x value "
        "dim x state dtype bytes, plus conv state); fixed, independent of length.",
    )
    linear_kind: LinearKind | None = Field(
        default=None,
        description="The linear-attention layers' kind (GatedDeltaNet, Mamba2, KDA); the engines' flags depend on "
        "it (Mamba2 runs with prefix caching off on vLLM 0.32).",
    )
    block_tokens: int | None = Field(
        default=None,
        ge=1,
        le=65_536,
        description="The KV block size the engine really uses for this model, in tokens (vLLM enlarges a "
        "hybrid's attention block until its page holds a recurrent state: 256 for the tiny Qwen3-Next on CPU). "
        "Transfers are counted in whole blocks of it; unset: the router's prefixBlockTokens.",
    )
    sliding_window: SlidingWindowSpec | None = Field(default=None, description="Sliding-window layers.")


class MeasuredKvPoint(ApiModel):
    """One measured point: a request of ``lengthTokens`` tokens holds ``kvMiB`` MiB of KV (incl. state)."""

    length_tokens: int = Field(ge=1, le=10_000_000, description="Input length, in tokens.")
    kv_mib: float = Field(
        gt=0, le=1e9, alias="kvMiB", description="KV cache size, in MiB (2^20 bytes), incl. fixed state."
    )


class MeasuredKvTable(ApiModel):
    """Measured KV sizes (like the paper's Table 5), interpolated piecewise-linearly."""

    points: list[MeasuredKvPoint] = Field(
        min_length=2,
        max_length=64,
        description="At least two points with distinct lengths.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["lengthTokens"]},
    )

    @field_validator("points")
    @classmethod
    def _distinct_lengths(cls, v: list[MeasuredKvPoint]) -> list[MeasuredKvPoint]:
        if len({p.length_tokens for p in v}) != len(v):
            raise ValueError("duplicate lengthTokens in points")
        return v


class ModelTokenizerSpec(ApiModel):
    """Where routers find the model's own tokenizer: files in a volume mounted into router and gateway pods
    (real tokenizer.json files exceed a ConfigMap's 1 MiB)."""

    file: str = Field(
        min_length=1,
        max_length=4096,
        description="Path of tokenizer.json inside the router's tokenizer mount (the chart's "
        "router.tokenizer.mountPath), e.g. /var/run/prfaas/tokenizer/tokenizer.json.",
    )
    chat_template_file: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="Path of the chat template (Jinja); default: chat_template.jinja beside the file, else "
        "tokenizer_config.json's chat_template.",
    )


class ModelProfileSpec(ApiModel):
    """What the control plane needs to know about a model: its KV footprint."""

    __cel_rules__ = (
        CelRule(
            rule="has(self.architecture) != has(self.measured)",
            message="set exactly one of architecture or measured",
            check=lambda s: (s.architecture is None) != (s.measured is None),
            field_path=".architecture",
        ),
    )

    served_model_name: str | None = Field(
        default=None, min_length=1, max_length=253, description="Model name clients send (informational)."
    )
    architecture: ModelArchitecture | None = Field(default=None, description="KV size from architecture.")
    measured: MeasuredKvTable | None = Field(default=None, description="KV size from measurements.")
    tokenizer: ModelTokenizerSpec | None = Field(
        default=None, description="The model's own tokenizer, for exact token counts in the routers."
    )


class ModelProfileStatus(ApiModel):
    """Derived facts about the profile, written by the operator."""

    observed_generation: int | None = Field(default=None, ge=0, description="Generation last processed.")
    kv_bytes_per_token: float | None = Field(default=None, ge=0, description="Growing KV per token, bytes.")
    fixed_kv_bytes: float | None = Field(default=None, ge=0, description="Fixed per-request state, bytes.")
    conditions: list[Condition] = conditions_field("Ready when the profile parses.")


class ModelProfile(ApiModel):
    """Cluster-scoped: referenced by name from PrefillCluster and PDCluster."""

    api_version: Literal["prfaas.io/v1alpha1"] = Field(default=GROUP_VERSION, description="API version.")
    kind: Literal["ModelProfile"] = Field(default=KIND_MODEL_PROFILE, description="Kind.")
    metadata: ObjectMeta
    spec: ModelProfileSpec
    status: ModelProfileStatus | None = None
