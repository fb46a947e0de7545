"""Prefix cache: hashed full token blocks in an LRU, as vLLM's automatic prefix caching keys them.

A block's hash chains its parent's hash with its own token ids, so block ``i`` matches only when the whole
prefix up to it matches (attention is causal). Only full blocks are cached. Counting follows vLLM's
``vllm:prefix_cache_queries_total`` / ``_hits_total``: queried and hit *tokens*.

A hybrid model (linear layers: ``checkpoints_only``) resumes a *local* prefill only where a recurrent state was
saved: vLLM 0.32's "align" mode keeps one at the *checkpoint* of each prompt it served, the end of the last whole
block of its N-1 tokens (:func:`prfaas_core.policy.decode_prefix.checkpoint_tokens`); such a hit is the longest
cached prefix that ends at a checkpoint. A decode that pulls the KV (``pulling=True``) reuses every whole block it
holds, dense or hybrid: it pulls the state at N-1 in full and needs none at the hit (measured on the real hybrid
tier: after a 1,080-token prompt, prompts sharing 300, 600 and 1,050 of its tokens reused 256, 512 and 1,024 tokens
at a 256-token block).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from prfaas_core.policy.decode_prefix import checkpoint_tokens


class PrefixCache:
    """An LRU of block hashes with a capacity in blocks (0 disables caching)."""

    def __init__(self, capacity_blocks: int, block_size: int, checkpoints_only: bool = False) -> None:
        self.capacity_blocks = capacity_blocks
        self.block_size = block_size
        self.checkpoints_only = checkpoints_only
        self._blocks: OrderedDict[bytes, bool] = OrderedDict()  # hash -> a recurrent state is saved there
        self.queried_tokens = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, hashes: Sequence[bytes], prompt_tokens: int, pulling: bool = False) -> int:
        """Tokens of the prompt already cached (leading blocks only), counted as one query.

        At least one token is always recomputed (the last prompt token produces the first output), and a hit is
        whole blocks, as in vLLM (it matches at most the full blocks of the first ``prompt_tokens - 1`` tokens);
        for a hybrid's local prefill (not ``pulling``) it ends at the last checkpoint among them.
        """
        at_checkpoints = self.checkpoints_only and not pulling
        usable = max(prompt_tokens - 1, 0) // self.block_size
        hit_blocks = 0
        for i, h in enumerate(hashes[:usable]):
            saved = self._blocks.get(h)
            if saved is None:
                break
            self._blocks.move_to_end(h)
            if saved or not at_checkpoints:
                hit_blocks = i + 1
        hit = hit_blocks * self.block_size
        self.queried_tokens += prompt_tokens
        self.hit_tokens += hit
        return hit

    def insert(self, hashes: Sequence[bytes], prompt_tokens: int | None = None) -> None:
        """Cache the blocks (most recently used), evicting the least recently used past capacity; a hybrid's
        state is saved at the checkpoint of a prompt of ``prompt_tokens`` (default: the blocks' tokens)."""
        if self.capacity_blocks <= 0:
            return
        n = len(hashes) * self.block_size if prompt_tokens is None else prompt_tokens
        checkpoint = checkpoint_tokens(n, self.block_size) // self.block_size - 1
        for i, h in enumerate(hashes):
            self._blocks[h] = self._blocks.get(h, False) or i == checkpoint
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()
