"""Generate the real-engine tier's tiny hybrid model (linear attention + full attention), seeded, no download.

A random-weight Qwen3-Next (``Qwen3NextForCausalLM``): 4 layers, 3 gated-DeltaNet (linear attention) and 1 full
attention (``full_attention_interval`` 4), hidden 256, head dim 64, linear key/value head dims 64, a few small
experts, bf16 (vLLM's CPU GDN kernels need bf16). The output layer is scaled up so that logits are peaked: random
weights otherwise give near-ties that flip between a single instance and a disaggregated pair. The tokenizer is
the dense tiny model's (``tiny_model.tokenizer``, the same seed). Run with the vLLM environment's Python:
``python tiny_hybrid_model.py OUT_DIR [qwen3next|granite4h]``.

``granite4h``: a random-weight Granite-4-H (``GraniteMoeHybridForCausalLM``): 4 layers, 3 Mamba2 (8 heads of 64,
state 64, one group) and 1 full attention, hidden 256, bf16. vLLM 0.32 runs it with prefix caching off only.
"""

import random
import sys
from pathlib import Path

import torch
from tiny_model import SEED, tokenizer
from transformers import (
    GraniteMoeHybridConfig,
    GraniteMoeHybridForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

LOGIT_SCALE = 8.0
"""The output layer's weights times this: peaked logits, a clear greedy choice."""


def special_ids(tok) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return {
        "vocab_size": len(tok),
        "bos_token_id": tok.convert_tokens_to_ids("<|im_start|>"),
        "eos_token_id": tok.convert_tokens_to_ids("<|im_end|>"),
        "pad_token_id": tok.convert_tokens_to_ids("<|endoftext|>"),
        "tie_word_embeddings": False,
        "max_position_embeddings": 8192,
        "torch_dtype": "bfloat16",
    }


def qwen3next(ids: dict[str, int]) -> tuple[PretrainedConfig, type[PreTrainedModel]]:
    config = Qwen3NextConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        full_attention_interval=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_conv_kernel_dim=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=128,
        decoder_sparse_step=1,
        **ids,
    )
    return config, Qwen3NextForCausalLM


def granite4h(ids: dict[str, int]) -> tuple[PretrainedConfig, type[PreTrainedModel]]:
    config = GraniteMoeHybridConfig(
        hidden_size=256,
        intermediate_size=128,
        shared_intermediate_size=128,
        num_hidden_layers=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        mamba_n_heads=8,
        mamba_d_head=64,
        mamba_d_state=64,
        mamba_n_groups=1,
        mamba_d_conv=4,
        mamba_expand=2,
        **ids,
    )
    return config, GraniteMoeHybridForCausalLM


MODELS = {"qwen3next": qwen3next, "granite4h": granite4h}


def main(out: Path, kind: str = "qwen3next") -> None:
    rng = random.Random(SEED)
    torch.manual_seed(SEED)
    tok = tokenizer(rng)
    config, cls = MODELS[kind](special_ids(tok))
    model = cls(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(LOGIT_SCALE)
    model = model.to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:3])
