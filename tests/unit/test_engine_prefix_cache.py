"""The engine emulator's prefix cache: chained block hashes and an LRU counted like vLLM's."""

from __future__ import annotations

import pytest

from prfaas_core.request.tokens import block_hashes
from prfaas_engine.prefix_cache import PrefixCache


def test_only_full_blocks_are_hashed() -> None:
    assert len(block_hashes(list(range(31)), 16)) == 1
    assert len(block_hashes(list(range(32)), 16)) == 2
    assert block_hashes(list(range(15)), 16) == []


def test_hashes_chain_so_a_change_invalidates_every_later_block() -> None:
    base = block_hashes(list(range(64)), 16)
    changed = list(range(64))
    changed[20] = 9999  # in block 1
    other = block_hashes(changed, 16)
    assert other[0] == base[0]
    assert all(a != b for a, b in zip(base[1:], other[1:], strict=True))


def test_same_block_content_at_another_position_does_not_match() -> None:
    a = block_hashes([1] * 16 + [2] * 16, 16)
    b = block_hashes([2] * 16, 16)
    assert a[1] != b[0]


def test_match_counts_leading_cached_blocks_and_keeps_the_last_token_to_compute() -> None:
    cache = PrefixCache(capacity_blocks=100, block_size=16)
    prompt = list(range(48))
    hashes = block_hashes(prompt, 16)
    assert cache.match(hashes, len(prompt)) == 0
    cache.insert(hashes)
    # all 3 blocks cached: the last token must be recomputed, and vLLM's hits are whole blocks (of the first 47
    # tokens: 2 blocks), so its whole block is (vllm/v1/core/kv_cache_manager.py, max_cache_hit_length)
    assert cache.match(hashes, len(prompt)) == 32
    assert cache.match(hashes[:2], 40) == 32
    longer = block_hashes([*prompt, *range(100, 116)], 16)
    assert cache.match(longer, 64) == 48
    assert (cache.queried_tokens, cache.hit_tokens) == (48 + 48 + 40 + 64, 32 + 32 + 48)


def test_a_gap_stops_the_match() -> None:
    cache = PrefixCache(capacity_blocks=100, block_size=4)
    hashes = block_hashes(list(range(12)), 4)
    cache.insert([hashes[0], hashes[2]])
    assert cache.match(hashes, 12) == 4


def test_lru_evicts_the_least_recently_used_blocks() -> None:
    cache = PrefixCache(capacity_blocks=2, block_size=4)
    a, b, c = (block_hashes([i] * 4, 4)[0] for i in range(3))
    cache.insert([a])
    cache.insert([b])
    assert cache.match([a], 5) == 4  # touching a makes b the oldest
    cache.insert([c])
    assert len(cache) == 2
    assert cache.match([b], 5) == 0
    assert cache.match([a], 5) == 4
    assert cache.match([c], 5) == 4


@pytest.mark.parametrize("capacity", [0])
def test_zero_capacity_disables_caching(capacity: int) -> None:
    cache = PrefixCache(capacity_blocks=capacity, block_size=4)
    hashes = block_hashes(list(range(8)), 4)
    cache.insert(hashes)
    assert cache.match(hashes, 8) == 0


def test_a_hybrids_local_prefill_resumes_only_at_a_checkpoint_a_pull_at_any_block() -> None:
    """vLLM's "align" mode keeps a recurrent state at the end of the last whole block of a prompt's N-1 tokens: a
    local prefill's hit ends there, never at an earlier block the prompts share (dense would hit those); a decode
    that pulls the state in full reuses every whole block it holds."""
    cache = PrefixCache(capacity_blocks=100, block_size=4, checkpoints_only=True)
    dense = PrefixCache(capacity_blocks=100, block_size=4)
    served = list(range(18))  # N-1 = 17 tokens: the checkpoint after 16 (block 4)
    for c in (cache, dense):
        c.insert(block_hashes(served, 4), len(served))
    again = block_hashes(served, 4)
    assert cache.match(again, 18) == dense.match(again, 18) == 16
    shares_10 = block_hashes([*served[:10], *range(100, 110)], 4)  # 2 whole blocks in common, no checkpoint
    assert dense.match(shares_10, 20) == 8
    assert cache.match(shares_10, 20) == 0
    assert cache.match(shares_10, 20, pulling=True) == 8
    extended = block_hashes([*served, *range(200, 210)], 4)
    assert cache.match(extended, 28) == 16  # resumes at the checkpoint, not at the longer dense prefix
