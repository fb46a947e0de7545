"""Prefix cache: hashed full token blocks in an LRU, as vLLM's automatic prefix caching keys them.

A block's hash chains its parent's hash with its own token ids, so block ``i`` matches only when the whole
prefix up to it matches (attention is causal). Only full blocks are cached. Counting follows vLLM's
``vllm:prefix_cache_queries_total`` / ``_hits_total``: queried and hit *tokens*.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    """An LRU of block hashes with a capacity in blocks (0 disables caching)."""

    def __init__(self, capacity_blocks: int, block_size: int) -> None:
        self.capacity_blocks = capacity_blocks
        self.block_size = block_size
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self.queried_tokens = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, hashes: Sequence[bytes], prompt_tokens: int) -> int:
        """Tokens of the prompt already cached (leading blocks only), counted as one query.

        At least one token is always recomputed (the last prompt token produces the first output), and a hit is
        whole blocks, as in vLLM (it matches at most the full blocks of the first ``prompt_tokens - 1`` tokens).
        """
        hit_blocks = 0
        for h in hashes:
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            hit_blocks += 1
        hit = min(hit_blocks, max(prompt_tokens - 1, 0) // self.block_size) * self.block_size
        self.queried_tokens += prompt_tokens
        self.hit_tokens += hit
        return hit

    def insert(self, hashes: Sequence[bytes]) -> None:
        """Cache the blocks (most recently used), evicting the least recently used past capacity."""
        if self.capacity_blocks <= 0:
            return
        for h in hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()
