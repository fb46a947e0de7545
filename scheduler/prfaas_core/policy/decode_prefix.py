"""What each decode instance holds of the prompts it decoded, as vLLM reuses it on a later KV pull: the router
learns it from what it routed, and a remote request's KV bytes (its counter, the gateway's booking) then leave
out what the decode side has (:meth:`~prfaas_core.capacity.kv.KvModel.pulled_kv_bytes`). Pure.

Every whole block of an earlier prompt (the decode computed its last token itself), dense and hybrid alike: a hit
ends at the first block the decode lacks (a 1,024-token prompt of 256-token blocks sent again reuses 768 tokens,
extended it reuses 1,024). A hybrid's decode needs no recurrent state at the hit: it pulls the state at N-1 from
the producer in full (measured on vLLM 0.32 with the tiny Qwen3-Next, 256-token blocks: after a 1,080-token prompt,
prompts sharing 300, 600, 800, 1,000 and 1,050 of its tokens reused 256, 512, 768, 768 and 1,024 tokens). A
*local* prefill on a hybrid resumes only where a state was saved, a checkpoint (:func:`checkpoint_tokens`).

A hit never covers the last prompt token (the engine computes at least one). Bounded: the blocks unused longest go
first (a decode engine's cache evicts too; an entry it dropped makes the counters low by that request's reuse).
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import names
from ..capacity.kv import KvModel
from ..request.tokens import PrefixIndex, block_hashes

DEFAULT_CAPACITY = 65_536
"""Blocks kept (whichever instances hold them): ~16M tokens of 256-token blocks."""


def checkpoint_tokens(prompt_tokens: int, block_tokens: int) -> int:
    """Where a hybrid engine keeps the recurrent state of a prompt it prefilled (vLLM's "align" mode), the one
    place a later *local* prefill can resume: the end of the last whole block of its N-1 tokens (0: none)."""
    return max(0, prompt_tokens - 1) // block_tokens * block_tokens


def decode_cached_header(value: str | None) -> int:
    """The gateway's reading of :data:`~prfaas_core.names.HEADER_DECODE_CACHED_TOKENS` (absent: 0); ValueError
    names the header when it is not a non-negative integer."""
    if value is None:
        return 0
    if not value.isdigit():
        raise ValueError(
            f"header {names.HEADER_DECODE_CACHED_TOKENS!r} must be a non-negative integer, got {value[:40]!r}"
        )
    return int(value)


class DecodeHoldings:
    def __init__(self, kv: KvModel, block_tokens: int, capacity: int = DEFAULT_CAPACITY) -> None:
        self.kv = kv
        self.block_tokens = kv.block_tokens or block_tokens
        self.capacity = capacity
        self._held = PrefixIndex(capacity, self.block_tokens)
        """Which decode instances hold which blocks: the router's prefix index (a bit per instance, the blocks
        unused for a generation evicted), where an ``OrderedDict`` of (instance, block) cost a 27K-token prompt
        ~2 ms of the event loop to learn."""

    def _hashes(self, ids: Sequence[int]) -> list[bytes]:
        usable = max(0, len(ids) - 1)  # a hit never covers the last token
        return block_hashes(ids[:usable], self.block_tokens)

    def held_tokens(
        self, ids: Sequence[int], instance: str | None, hashes: Sequence[bytes] | None = None, block: int = 0
    ) -> int:
        """Leading tokens of ``ids`` that decode ``instance`` holds (0 for None); ``hashes``, ``block``: as
        :meth:`learn` takes them (a long prompt is not hashed again)."""
        if instance is None:
            return 0
        if hashes is None or block != self.block_tokens:
            hashes = self._hashes(ids)
        else:  # the whole blocks of the N-1 tokens a hit may cover
            hashes = hashes[: max(0, len(ids) - 1) // block]
        return self._held.match(hashes).get(instance, 0)

    def learn(
        self, ids: Sequence[int], instance: str | None, hashes: Sequence[bytes] | None = None, block: int = 0
    ) -> None:
        """Decode ``instance`` has served ``ids`` (its KV, pulled or computed, is in its cache now). ``hashes``: the
        unsalted :func:`block_hashes` of ``ids`` at ``block`` tokens a block, when the caller has them (used when
        ``block`` is this one's: a long prompt is not hashed twice)."""
        if instance is None:
            return
        if hashes is None or block != self.block_tokens:
            hashes = block_hashes(ids, self.block_tokens)
        self._held.insert(hashes, instance)  # every whole block: it computed the last token itself

    def retarget(self, kv: KvModel, block_tokens: int) -> None:
        """A new configuration: the same holdings if the model's blocks stay, none otherwise."""
        block = kv.block_tokens or block_tokens
        if block != self.block_tokens or kv.recurrent != self.kv.recurrent:
            self._held = PrefixIndex(self.capacity, block)
        self.kv, self.block_tokens = kv, block

    def forget(self, instances: set[str]) -> None:
        """Instances that left (or restarted with an empty cache)."""
        self._held.forget(instances)
