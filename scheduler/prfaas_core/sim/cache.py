"""The hybrid prefix cache pool of one cluster (paper §3.2, Fig. 4; paper-spec §2.7).

Each cluster (PrFaaS, PD) runs one distributed pool over host DRAM/SSD shared by its instances over RDMA,
so the pool — not an instance — holds a prefix, and every instance of the cluster sees the same hit.

A hybrid model keeps two kinds of state, and they hit differently:

* **full-attention KV is block-level**: it grows with length and is reusable in whole blocks
  (``block_tokens``), so a prefix matches up to the last full block it shares (partial hits);
* **linear / SWA state is request-level**: its size does not depend on length, and a snapshot is reusable
  **only at exactly the length it was taken at**.

Modelling choice (paper-spec §2.7, "model hits at the granularity of stored state checkpoints"): like
vLLM's hybrid prefix caching in *align* mode, a prefill (or a finished decode) checkpoints the linear
state once, at the last block boundary of the context it processed; a pool entry keeps a session's
full-attention blocks and its last ``max_snapshots`` checkpoints. A request sharing ``S`` tokens with the
entry can reuse ``hit = max{s ∈ snapshots : s ≤ floor(min(S, blocks)/B)·B}`` tokens (the one hybrid rule,
:func:`~prfaas_core.policy.kv_index.checkpoint_hit`, which the router's exact index applies too) — the full-attention
blocks beyond the last usable checkpoint are *lost to the linear-state rule* (counted, so a user sees what
a per-block linear checkpoint would buy). When a request diverges from the cached history (``S`` less
than the entry), checkpoints past ``S`` belong to the old branch and are dropped on the next write.

The checkpoint rule is a *prefill's*: a decode that pulls a remote prefill's KV reuses every whole block the pool
holds (the state crosses in full; measured on vLLM 0.32), so the simulator leaves the block match
(:meth:`HybridPrefixPool.peek`'s second figure) out of the KV that crosses the link.

Capacity is bounded (bytes of ``S_kv`` plus one fixed state per checkpoint), evicted least recently used.
"""

from __future__ import annotations

from collections import OrderedDict

from ..capacity.kv import KvModel
from ..policy.kv_index import checkpoint_hit


class _Entry:
    __slots__ = ("blocks_tokens", "bytes", "snapshots")

    def __init__(self, blocks_tokens: int, snapshots: tuple[int, ...], nbytes: float) -> None:
        self.blocks_tokens = blocks_tokens
        self.snapshots = snapshots
        self.bytes = nbytes


class HybridPrefixPool:
    """One cluster's pool: ``session -> (full-attention blocks, linear checkpoints)``, LRU-bounded."""

    def __init__(self, kv: KvModel, capacity_bytes: float, block_tokens: int = 512, max_snapshots: int = 4) -> None:
        if block_tokens < 1:
            raise ValueError("block_tokens must be >= 1")
        self._kv = kv
        self.capacity_bytes = capacity_bytes
        self.block_tokens = block_tokens
        self.max_snapshots = max_snapshots
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self.used_bytes = 0.0
        self.lookups = 0
        self.hit_tokens = 0
        self.block_match_tokens = 0
        """Tokens the full-attention blocks alone would have matched (≥ ``hit_tokens``)."""
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def peek(self, session: int, shared_tokens: int) -> tuple[int, int]:
        """``(hit, block_match)`` for a request sharing ``shared_tokens`` with the session, without counting."""
        entry = self._entries.get(session)
        if entry is None or shared_tokens <= 0:
            return 0, 0
        limit = min(shared_tokens, entry.blocks_tokens)
        limit -= limit % self.block_tokens
        return checkpoint_hit(limit, entry.snapshots), limit

    def lookup(self, session: int, shared_tokens: int) -> int:
        """The reusable prefix (tokens) for a request sharing ``shared_tokens`` with the session's history."""
        hit, limit = self.peek(session, shared_tokens)
        self.lookups += 1
        self.hit_tokens += hit
        self.block_match_tokens += limit
        if hit and session in self._entries:
            self._entries.move_to_end(session)
        return hit

    def store(self, session: int, context_tokens: int, valid_upto_tokens: int) -> None:
        """Record that the cluster processed ``context_tokens`` of the session; the previous entry's
        checkpoints up to ``valid_upto_tokens`` (the prefix this context shares with it) stay valid."""
        b = self.block_tokens
        blocks = context_tokens - context_tokens % b
        old = self._entries.pop(session, None)
        snaps: tuple[int, ...] = (blocks,) if blocks > 0 else ()
        if old is not None:
            self.used_bytes -= old.bytes
            if old.blocks_tokens >= blocks and valid_upto_tokens >= blocks:
                # this context is a prefix of the cached history: keep the longer entry, add the checkpoint
                # (an entry's checkpoints are sorted and distinct: one it holds already leaves them as they are)
                if not snaps or snaps[0] in old.snapshots:
                    snaps = old.snapshots
                else:
                    merged = set(old.snapshots)
                    merged.update(snaps)
                    snaps = tuple(sorted(merged))
                blocks = old.blocks_tokens
            else:
                kept = tuple([s for s in old.snapshots if s <= valid_upto_tokens and s < blocks])
                snaps = kept + snaps
        snaps = snaps[-self.max_snapshots :]
        if not snaps:
            return
        nbytes = self._kv.curve(blocks) + (len(snaps) - 1) * self._kv.fixed_bytes  # (kv_bytes without its call)
        entry = _Entry(blocks, snaps, nbytes)
        self._entries[session] = entry
        self.used_bytes += nbytes
        while self.used_bytes > self.capacity_bytes and self._entries:
            _, victim = self._entries.popitem(last=False)
            self.used_bytes -= victim.bytes
            self.evictions += 1

    def import_prefix(self, session: int, tokens: int) -> None:
        """A prefix moved here from the other cluster (a cross-cluster cache transfer): blocks and the
        checkpoint at ``tokens`` (which is a checkpoint of the source, hence block-aligned)."""
        entry = self._entries.get(session)
        if entry is not None and entry.blocks_tokens >= tokens and tokens in entry.snapshots:
            return
        self.store(session, tokens, tokens)
