"""The hybrid prefix cache pool: block-level full-attention hits, linear state only at exact checkpoints."""

from __future__ import annotations

import pytest

from prfaas_core.capacity.plan_inputs import case_study_inputs
from prfaas_core.sim.cache import HybridPrefixPool

KV = case_study_inputs().kv
B = 512


def pool(capacity: float = 1e15, snapshots: int = 4) -> HybridPrefixPool:
    return HybridPrefixPool(KV, capacity, block_tokens=B, max_snapshots=snapshots)


def test_a_continuation_hits_up_to_the_last_full_block_of_the_cached_context() -> None:
    p = pool()
    p.store(session=1, context_tokens=10_300, valid_upto_tokens=0)  # blocks and checkpoint at 10_240
    assert p.lookup(1, 10_300) == 10_240  # the 60-token tail is not a full block: recomputed
    assert p.lookup(1, 50_000) == 10_240  # sharing more than is cached: the cached part
    assert p.lookup(2, 10_300) == 0  # another session


def test_a_partial_match_reuses_only_an_exact_linear_checkpoint() -> None:
    p = pool()
    p.store(1, 4_096, 0)  # turn 1: checkpoint at 4096
    p.store(1, 20_480, 4_096)  # turn 2 extends it: checkpoints 4096 and 20480, blocks to 20480
    # a turn that rewrites history after 15_000 tokens: full-attention blocks match 14_848 tokens, but the
    # linear state exists only at 4096 and 20480 — the hit falls back to 4096
    hit, blocks = p.peek(1, 15_000)
    assert blocks == 14_848
    assert hit == 4_096
    assert p.lookup(1, 15_000) == 4_096
    assert p.block_match_tokens - p.hit_tokens == 14_848 - 4_096  # counted as lost to the linear rule


def test_a_diverging_turn_drops_the_old_branch_checkpoints() -> None:
    p = pool()
    p.store(1, 4_096, 0)
    p.store(1, 20_480, 4_096)
    p.store(1, 12_288, 8_000)  # diverged after 8000 tokens: 20480 belongs to the old branch
    assert p.peek(1, 20_480) == (12_288, 12_288)
    assert p.peek(1, 10_000) == (4_096, 9_728)


def test_a_shorter_consistent_context_adds_a_checkpoint_without_shrinking() -> None:
    p = pool()
    p.store(1, 30_000, 0)  # the next turn's prompt is already cached
    p.store(1, 20_480, 20_480)  # a late decode-end of the previous turn (a prefix of it)
    assert p.peek(1, 30_000)[0] == 29_696
    assert p.peek(1, 25_000)[0] == 20_480


def test_lru_eviction_keeps_the_pool_within_capacity() -> None:
    one = KV.kv_bytes(8_192)
    p = pool(capacity=2.5 * one)
    for s in range(3):
        p.store(s, 8_192, 0)
    assert len(p) == 2 and p.evictions == 1
    assert p.used_bytes <= p.capacity_bytes
    assert p.lookup(0, 8_192) == 0  # the oldest went first
    assert p.lookup(2, 8_192) == 8_192


def test_checkpoints_are_bounded() -> None:
    p = pool(snapshots=2)
    for k in range(1, 6):
        p.store(1, k * 1024, (k - 1) * 1024)
    assert p.peek(1, 5 * 1024)[0] == 5 * 1024
    assert p.peek(1, 4 * 1024)[0] == 4 * 1024
    assert p.peek(1, 3 * 1024)[0] == 0  # dropped: only the last two are kept


def test_an_imported_prefix_is_reusable_at_its_length() -> None:
    p = pool()
    p.import_prefix(7, 16_384)
    assert p.lookup(7, 20_000) == 16_384


def test_block_size_must_be_positive() -> None:
    with pytest.raises(ValueError):
        HybridPrefixPool(KV, 1e12, block_tokens=0)
