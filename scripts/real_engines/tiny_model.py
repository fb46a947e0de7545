"""Generate the real-engine tier's tiny model, seeded (the same bytes every run), with no download.

A 2-layer Llama (hidden 128, 4 attention heads of dim 32 — a head size the CPU attention backend supports —,
2 KV heads, bf16 random weights) and a byte-level BPE tokenizer (vocabulary 2,048) trained here on generated
text, wrapped as a fast tokenizer with ChatML special tokens and a chat template. Run with the vLLM
environment's Python: ``python tiny_model.py OUT_DIR``.
"""

import random
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SEED = 20261201
VOCAB = 2048
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def corpus(rng: random.Random, lines: int = 4000) -> list[str]:
    syllables = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"] + list("aeiou")
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    out = []
    for _ in range(lines):
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(5, 30)))
        out.append(sentence.capitalize() + rng.choice([".", "?", "!", ","]) + f" {rng.randint(0, 9999)}")
    return out


def tokenizer(rng: random.Random) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(rng), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def main(out: Path) -> None:
    rng = random.Random(SEED)
    torch.manual_seed(SEED)
    tok = tokenizer(rng)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=8192,
        bos_token_id=tok.convert_tokens_to_ids("<|im_start|>"),
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
