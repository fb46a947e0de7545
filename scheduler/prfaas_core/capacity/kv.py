"""The KV model: ``S_kv(l)``, the bytes of KV (incl. fixed linear/SWA state) a request of ``l`` uncached tokens
produces, and the per-instance KV throughput ``Φ_kv(l) = S_kv(l) / T_prefill(l)`` (paper Eq. 1).

Built from a :class:`~prfaas_core.api.ModelProfileSpec`:

* **architecture** (paper-spec §4): ``S_kv(l) = n_full·b_full·l + n_linear·state + n_swa·b_swa·min(l, W)``
  where ``b_full`` is ``kv_heads·(head_dim + value_head_dim)·dtype`` bytes per token per layer for GQA/MHA
  (K and V), or ``mla_latent_dim·dtype`` for MLA (one compressed latent).
* **measured** table (like Table 5): piecewise-linear through the points, extended linearly past the ends.

Units: bytes, tokens, seconds; Gbps = 10^9 bit/s and MiB = 2^20 bytes (paper-spec §2.1 unit check).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Literal

from ..api.model_profile import ModelArchitecture, ModelProfileSpec
from ..names import GBPS_BITS, MIB
from .curves import PiecewisePolynomial, least_squares_line

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


class KvModelError(ValueError):
    """A model profile that cannot give a usable ``S_kv``; the message names the field."""


@dataclass(frozen=True)
class KvModel:
    """``S_kv(l)`` as a piecewise polynomial in tokens, plus its affine summary.

    ``bytes_per_token`` and ``fixed_bytes`` summarise the curve as ``S_kv ≈ fixed + per_token·l`` (what
    ModelProfile's status prints): exact for a pure full-attention/linear architecture; for sliding-window
    layers ``fixed`` holds the full window; for a measured table they are the least-squares line.
    """

    curve: PiecewisePolynomial
    bytes_per_token: float
    fixed_bytes: float
    source: Literal["architecture", "measured"]
    block_tokens: int | None = None
    """The engines' KV block size, when known (the profile's ``blockTokens``, else RouterConfig's
    ``prefixBlockTokens``, the engine's ``blockSize``): an engine holds and moves whole blocks, so
    :meth:`block_kv_bytes` rounds up to them."""
    recurrent: bool = False
    """A hybrid (linear-attention layers): a pull carries the fixed recurrent state, and the decode side pulls the
    KV of all prompt tokens but the last, which it computes itself (vLLM 0.32: the N-1 rule)."""

    def kv_bytes(self, length_tokens: float) -> float:
        """``S_kv(l)`` in bytes."""
        return self.curve(length_tokens)

    def with_blocks(self, block_tokens: int | None) -> KvModel:
        """The same model, its transfers counted in whole blocks of ``block_tokens``."""
        return replace(self, block_tokens=block_tokens)

    def with_default_blocks(self, block_tokens: int | None) -> KvModel:
        """The same model counted in blocks of ``block_tokens`` unless the profile names its own block size."""
        return self if self.block_tokens is not None else replace(self, block_tokens=block_tokens)

    def pulled_tokens(self, prompt_tokens: int) -> int:
        """Prompt tokens whose KV a decode side pulls: all of them, or all but the last for a hybrid."""
        return max(0, prompt_tokens - 1) if self.recurrent else max(0, prompt_tokens)

    def pulled_kv_bytes(self, prompt_tokens: int, decode_cached_tokens: int = 0) -> float:
        """The bytes that cross the link when a decode side pulls a prompt of ``prompt_tokens`` whose first
        ``decode_cached_tokens`` it holds already: the growing KV of the whole blocks it lacks (of the
        :meth:`pulled_tokens`; a cached prefix counts in whole blocks) plus the fixed state. Measured on vLLM
        0.32's transferred-bytes counter: a dense model pulls ``ceil(N/B)`` blocks, a hybrid
        ``ceil((N-1-cached)/B)`` attention blocks plus its recurrent state (``docs/hybrid-models.md``)."""
        tokens = self.pulled_tokens(prompt_tokens)
        cached = min(max(0, decode_cached_tokens), tokens)
        if self.block_tokens is None:
            lacking = float(tokens - cached)
        else:
            blocks = whole_blocks(tokens, self.block_tokens) - cached // self.block_tokens
            lacking = float(max(0 if self.recurrent else 1, blocks) * self.block_tokens)
        return self.kv_bytes(lacking)

    def block_kv_bytes(self, length_tokens: float) -> float:
        """The KV bytes an engine moves for ``length_tokens``: ``S_kv`` of the whole blocks that hold them (as
        vLLM's NixlConnector reads block descriptors); ``S_kv(l)`` itself when the block size is not known."""
        if self.block_tokens is None or length_tokens <= 0:
            return self.kv_bytes(length_tokens)
        return self.kv_bytes(whole_blocks(length_tokens, self.block_tokens) * self.block_tokens)

    def kv_throughput_gbps(self, length_tokens: float, prefill_time_s: float) -> float:
        """``Φ_kv(l) = S_kv(l) / T_prefill(l)`` in Gbps, for one instance taking ``prefill_time_s`` (Eq. 1)."""
        if prefill_time_s <= 0:
            raise ValueError("prefill_time_s must be positive")
        return self.kv_bytes(length_tokens) * 8.0 / prefill_time_s / GBPS_BITS


def whole_blocks(tokens: float, block_tokens: int) -> int:
    """KV blocks of ``block_tokens`` that hold ``tokens`` (the last one partly filled)."""
    return math.ceil(tokens / block_tokens) if tokens > 0 else 0


def full_attention_bytes_per_token_per_layer(arch: ModelArchitecture) -> int:
    """K and V (GQA/MHA) or the MLA latent, bytes per token, for one full-attention layer."""
    dtype = DTYPE_BYTES[arch.kv_dtype]
    if arch.mla_latent_dim is not None:
        return arch.mla_latent_dim * dtype
    if arch.kv_heads is None or arch.head_dim is None:
        return 0
    value_dim = arch.value_head_dim if arch.value_head_dim is not None else arch.head_dim
    return arch.kv_heads * (arch.head_dim + value_dim) * dtype


def kv_model_from_architecture(arch: ModelArchitecture) -> KvModel:
    """``S_kv(l) = n_full·b_full·l + n_linear·state + n_swa·b_swa·min(l, W)`` (paper-spec §4)."""
    per_token = float(arch.full_attention_layers * full_attention_bytes_per_token_per_layer(arch))
    fixed = float(arch.linear_layers * arch.linear_state_bytes_per_layer)
    blocks, recurrent = arch.block_tokens, arch.linear_layers > 0
    swa = arch.sliding_window
    if swa is None:
        curve = PiecewisePolynomial.through_points([(0.0, fixed), (1.0, fixed + per_token)])
        return KvModel(curve, per_token, fixed, "architecture", blocks, recurrent)
    value_dim = swa.value_head_dim if swa.value_head_dim is not None else swa.head_dim
    swa_per_token = float(swa.layers * swa.kv_heads * (swa.head_dim + value_dim) * DTYPE_BYTES[arch.kv_dtype])
    window = float(swa.window_tokens)
    at_window = fixed + (per_token + swa_per_token) * window
    curve = PiecewisePolynomial.through_points(
        [(0.0, fixed), (window, at_window), (2 * window, at_window + per_token * window)]
    )
    return KvModel(curve, per_token, fixed + swa_per_token * window, "architecture", blocks, recurrent)


def kv_model_from_profile(spec: ModelProfileSpec) -> KvModel:
    """The KV model a ModelProfile's spec describes (architecture or measured table)."""
    if spec.architecture is not None:
        return kv_model_from_architecture(spec.architecture)
    if spec.measured is None:
        raise KvModelError("spec: set exactly one of architecture or measured")
    points = sorted((float(p.length_tokens), p.kv_mib * MIB) for p in spec.measured.points)
    if any(b[1] < a[1] for a, b in itertools.pairwise(points)):
        raise KvModelError("spec.measured.points: kvMiB must not decrease as lengthTokens grows")
    curve = PiecewisePolynomial.through_points(points)
    if curve(0.0) < 0:
        raise KvModelError(
            "spec.measured.points: extrapolating below the shortest point gives a negative KV size; "
            "add a point at a shorter length"
        )
    fixed, per_token = least_squares_line(points)
    return KvModel(curve, per_token, fixed, "measured")
