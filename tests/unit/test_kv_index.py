"""The exact prefix index from the engines' KV events (vLLM 0.32's BlockStored/BlockRemoved/AllBlocksCleared as
msgpack decodes them) and the one hybrid checkpoint rule."""

from __future__ import annotations

import hashlib

import pytest

from prfaas_core.policy.kv_index import KvEventIndex, checkpoint_hit
from prfaas_core.request.tokens import PrefixIndex, block_hashes

B = 4


def vh(ids: list[int], parent: bytes = b"") -> bytes:
    """A stand-in for vLLM's own hash (sha256 chain): not ours, so the index must map it."""
    return hashlib.sha256(parent + bytes(str(ids), "ascii")).digest()


def engine_hashes(ids: list[int]) -> list[bytes]:
    out, parent = [], b""
    for i in range(0, len(ids) - len(ids) % B, B):
        parent = vh(ids[i : i + B], parent)
        out.append(parent)
    return out


def stored(ids: list[int], start_block: int, group: int = 0, only: list[int] | None = None, kind=None) -> dict:
    """vLLM's BlockStored for blocks ``start_block..`` of ``ids`` (``only``: the blocks a recurrent group keeps)."""
    hs = engine_hashes(ids)
    n = len(ids) // B
    picked = list(range(start_block, n)) if only is None else only
    ev = {
        "type": "BlockStored",
        "block_hashes": [hs[i] for i in picked],
        "parent_block_hash": hs[start_block - 1] if start_block else None,
        "token_ids": ids[start_block * B : n * B],
        "block_size": B,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "group_idx": group,
    }
    if kind is not None:
        ev["kv_cache_spec_kind"] = kind
    return ev


def removed(ids: list[int], blocks: list[int], group: int = 0) -> dict:
    hs = engine_hashes(ids)
    return {"type": "BlockRemoved", "block_hashes": [hs[i] for i in blocks], "medium": "GPU", "group_idx": group}


def batch(*events: dict) -> list:
    return [1.0, list(events), None]


def index(recurrent: bool = False) -> KvEventIndex:
    return KvEventIndex(PrefixIndex(1024, B), recurrent=recurrent)


PROMPT = list(range(100, 140))  # 10 blocks


def test_the_rule_is_the_deepest_checkpoint_at_or_below_the_attention_hit() -> None:
    assert checkpoint_hit(1024, [512, 1024, 1152]) == 1024
    assert checkpoint_hit(1000, [512, 1024]) == 512
    assert checkpoint_hit(1024, [1152]) == 0
    assert checkpoint_hit(1024, []) == 0


def test_blocks_stored_are_matched_in_our_keys_and_removed_ones_dropped() -> None:
    idx = index()
    idx.apply("e1", 0, batch(stored(PROMPT[:24], 0)))  # 6 blocks
    idx.apply("e1", 1, batch(stored(PROMPT, 6)))  # the rest, chained from block 5
    ours = block_hashes(PROMPT, B)
    assert idx.match(ours) == {"e1": 40}
    idx.apply("e1", 2, batch(removed(PROMPT, [7, 8, 9])))  # evicted: the match ends before block 7
    assert idx.match(ours) == {"e1": 28}
    other = block_hashes([1, 2, 3, 4, *PROMPT], B)
    assert idx.match(other) == {}
    idx.apply("e1", 3, batch({"type": "AllBlocksCleared"}))
    assert idx.match(ours) == {} and idx.held_blocks("e1") == 0


def test_an_engine_without_events_is_matched_by_the_learned_index_and_events_override_it() -> None:
    idx = index()
    ours = block_hashes(PROMPT, B)
    idx.insert(ours, "e1")
    idx.insert(ours, "e2")
    idx.apply("e2", 0, batch(stored(PROMPT[:8], 0)))  # e2 publishes: it holds 2 blocks, whatever was routed
    assert idx.match(ours) == {"e1": 40, "e2": 8}
    idx.detach("e2")
    assert idx.match(ours) == {"e1": 40, "e2": 40}


def test_a_gap_or_a_restart_clears_the_engines_holdings() -> None:
    idx = index()
    ours = block_hashes(PROMPT, B)
    idx.apply("e1", 5, batch(stored(PROMPT, 0)))
    got = idx.apply("e1", 7, batch())  # batch 6 lost: a removal may be in it
    assert got.resync is not None and "gap" in got.resync
    assert idx.match(ours) == {} and idx.cleared("e1") == 1
    idx.apply("e1", 8, batch(stored(PROMPT, 0)))
    assert idx.match(ours) == {"e1": 40}
    got = idx.apply("e1", 0, batch())
    assert got.resync is not None and "restarted" in got.resync and idx.match(ours) == {}
    # a continuation whose parent was never seen cannot be keyed: counted, not guessed
    assert idx.apply("e1", 1, batch(stored(PROMPT, 6))).unresolved == 4


def test_a_hybrid_resumes_only_at_a_checkpoint() -> None:
    """The recurrent group (1) keeps only the block where a prompt's last full block ended; the attention group (0)
    keeps them all. vLLM 0.32 names no kind: the sparse store says which group is recurrent."""
    idx = index(recurrent=True)
    first = PROMPT[:27]  # 6 full blocks: checkpoint at 24 tokens
    idx.apply("e1", 0, batch(stored(first, 1 - 1, group=1, only=[5]), stored(first, 0, group=0)))
    assert idx.match(block_hashes(first, B)) == {"e1": 24}  # the repeat resumes at the checkpoint
    assert idx.match(block_hashes(PROMPT, B)) == {"e1": 24}  # an extension too
    diverged = PROMPT[:16] + [7] * 20  # shares 4 blocks: no checkpoint inside them
    assert idx.match(block_hashes(diverged, B)) == {}
    assert idx.exact_hit("e1", block_hashes(diverged, B)) == (0, 16)
    # once the diverging prompt ran, vLLM keeps a checkpoint where the prompts diverged (block 4) and its own end
    idx.apply(
        "e1",
        1,
        batch(stored(diverged, 4, group=0), stored(diverged, 4, group=1, only=[8]), stored(diverged, 0, 1, only=[3])),
    )
    assert idx.match(block_hashes(PROMPT[:16] + [9] * 8, B)) == {"e1": 16}
    # an evicted checkpoint falls back to the one before it
    idx.apply("e1", 2, batch(removed(first, [5], group=1)))
    assert idx.match(block_hashes(first, B)) == {"e1": 16}


def test_a_kind_named_by_the_event_wins() -> None:
    idx = index(recurrent=False)
    ids = PROMPT[:8]
    idx.apply("e1", 0, batch(stored(ids, 0, group=0, kind="full_attention"), stored(ids, 0, 1, [1], kind="mamba")))
    assert idx.match(block_hashes(ids, B)) == {"e1": 8}
    assert idx.match(block_hashes([*ids[:4], 1, 1, 1, 1], B)) == {}


def test_a_batch_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError, match="batch"):
        index().apply("e1", 0, {"events": []})


def test_forget_drops_both_kinds_of_holdings() -> None:
    idx = index()
    ours = block_hashes(PROMPT, B)
    idx.insert(ours, "e1")
    idx.apply("e2", 0, batch(stored(PROMPT, 0)))
    idx.forget({"e1", "e2"})
    assert idx.match(ours) == {} and len(idx) == 0


def test_without_events_a_hybrid_is_matched_at_the_checkpoints_learned_from_routing() -> None:
    """The learned fallback applies the same rule: a checkpoint at each routed prompt's last whole block and where it
    diverged from what the instance held."""
    idx = index(recurrent=True)
    first = PROMPT[:27]  # 6 blocks
    idx.insert(block_hashes(first, B), "e1")
    assert idx.match(block_hashes(first, B)) == {"e1": 24}
    assert idx.match(block_hashes(PROMPT[:16] + [7] * 20, B)) == {}  # 4 shared blocks, no checkpoint among them
    idx.insert(block_hashes(PROMPT[:16] + [7] * 20, B), "e1")  # diverged at block 4: a checkpoint there
    assert idx.match(block_hashes(PROMPT[:16] + [9] * 8, B)) == {"e1": 16}
    idx.retarget(set(), recurrent=False)  # a dense model: every learned block counts
    idx.insert(block_hashes(first, B), "e1")
    assert idx.match(block_hashes(PROMPT, B)) == {"e1": 24}
