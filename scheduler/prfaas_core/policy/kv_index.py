"""What each engine's prefix cache holds, exactly, from the engine's own KV events, and the one hybrid cache rule.

vLLM publishes its prefix cache's changes (``--kv-events-config``, a ZMQ PUB socket; frames ``(topic, seq, payload)``
with an 8-byte big-endian sequence number and a msgpack ``[ts, events, dp_rank]`` batch, vLLM 0.32):

* ``BlockStored``: ``block_hashes`` (vLLM's own chain hashes), ``parent_block_hash`` (the hash of the block before
  the first, None at the prompt's start), ``token_ids`` (the ids of all the full blocks from the parent on),
  ``block_size`` and ``group_idx`` (the KV cache group), optionally ``kv_cache_spec_kind``;
* ``BlockRemoved``: ``block_hashes`` and ``group_idx`` (evicted, or replaced);
* ``AllBlocksCleared`` (``/reset_prefix_cache``).

The index keeps its own keys (the BLAKE2b chain of :func:`~prfaas_core.request.tokens.block_hashes`, what the
router computes for a prompt): a store's token ids give our key of each engine hash (chained from the parent's
key), and a removal resolves through that map. Each group's holdings are kept apart (a bit per group): a
recurrent-state (Mamba) group's blocks are checkpoints, never attention blocks.

**The hybrid rule** (:func:`checkpoint_hit`, one implementation: this index, the router's instance pick and ``t``'s
uncached length through it, the simulator's :class:`~prfaas_core.sim.cache.HybridPrefixPool`): a linear-attention
model's recurrent state resumes only at a saved checkpoint, so the usable hit is the deepest checkpoint at or below
the attention hit, 0 where there is none. vLLM's "align" mode saves one where a prompt's last full block ended and
where prompts diverged; its Mamba groups' ``BlockStored`` name only those blocks (the others are null), which is how
the index tells a recurrent group from an attention group when the event carries no kind.

A gap in the sequence (a lost batch: the subscriber was slow, the socket reconnected) or a sequence that goes back
(the engine restarted) clears that engine's holdings: afterwards the index under-promises (a block held from before
is not known) but never promises a block the engine may have dropped. An engine that publishes nothing (events
off, or the subscriber not connected yet) is matched by the learned index (what the router routed), per engine.
Pure: the router's subscriber feeds decoded batches in.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..request.tokens import PrefixIndex, block_hashes

RECURRENT_KINDS = frozenset({"mamba"})
"""``kv_cache_spec_kind`` values of a recurrent-state group (vLLM's ``KVCacheSpecKind``)."""
ATTENTION = "attention"
RECURRENT = "recurrent"
"""The two ``cache_kind`` values the index reports hits by."""


def cache_kind(recurrent: bool) -> str:
    """The ``cache_kind`` label of a model's prefix hits."""
    return RECURRENT if recurrent else ATTENTION


def unhonoured_tokens(predicted: int, prompt_tokens: int, block_size: int, response: Any) -> int | None:
    """Predicted hit tokens the engine did not honour: the prediction (capped where vLLM caps a hit: the last prompt
    token is always computed, so at most the whole blocks of ``prompt_tokens - 1``) less the engine's reported
    ``usage.prompt_tokens_details.cached_tokens``, at least 0; None when the answer reports no cached tokens."""
    usage = response.get("usage") if isinstance(response, dict) else None
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if not isinstance(cached, int) or isinstance(cached, bool):
        return None
    usable = max(0, prompt_tokens - 1)
    cap = usable - usable % block_size if block_size > 0 else usable
    return max(0, min(predicted, cap) - cached)


def checkpoint_hit(attention_hit: int, checkpoints: Iterable[int]) -> int:
    """The usable prefix of a hybrid model (tokens): the deepest checkpoint ``<= attention_hit``, 0 where none."""
    best = 0
    for c in checkpoints:
        if best < c <= attention_hit:
            best = c
    return best


@dataclass
class _Engine:
    """One engine's holdings as its events say."""

    seq: int | None = None
    keys: dict[Any, bytes] = field(default_factory=dict)
    """vLLM's block hash -> our key."""
    held: OrderedDict[bytes, int] = field(default_factory=OrderedDict)
    """Our key -> the groups that hold it (a bit per group), oldest first (O(1) to evict the oldest)."""
    recurrent: int = 0
    """The groups known to hold recurrent state (bits)."""
    attention: int = 0
    """The groups known to hold attention KV (bits)."""
    cleared: int = 0
    """Times its holdings were cleared for a gap or a restart of its publisher."""

    def clear(self) -> None:
        self.keys.clear()
        self.held.clear()


@dataclass(frozen=True)
class Applied:
    """What one batch did to an engine's holdings."""

    stored: int = 0
    removed: int = 0
    unresolved: int = 0
    """Blocks whose key could not be known (a parent or a hash never seen: stored before a gap)."""
    resync: str | None = None
    """Why the holdings were cleared before this batch (a gap or a restart), else None."""


class KvEventIndex:
    """Per engine: the exact holdings where its events arrive, else the learned :class:`PrefixIndex`.

    Same interface as the learned index (``match``, ``insert``, ``forget``) so that the router uses either."""

    def __init__(self, learned: PrefixIndex, recurrent: bool = False, capacity_blocks: int | None = None) -> None:
        self.learned = learned
        self.block_size = learned.block_size
        self.recurrent = recurrent
        """The model keeps recurrent state (a hybrid): hits only at checkpoints."""
        self.capacity_blocks = learned.capacity_blocks if capacity_blocks is None else capacity_blocks
        self._engines: dict[str, _Engine] = {}
        self._points: OrderedDict[tuple[str, bytes], None] = OrderedDict()
        """(instance, block) where a learned hybrid instance holds a checkpoint, oldest first."""

    @classmethod
    def learning(cls, capacity_blocks: int, block_size: int) -> KvEventIndex:
        """An index over a learned one of ``capacity_blocks`` blocks of ``block_size`` tokens."""
        return cls(PrefixIndex(capacity_blocks, block_size))

    def __len__(self) -> int:
        return len(self.learned) + sum(len(e.held) for e in self._engines.values())

    # --- the events -----------------------------------------------------------------------------------------
    def live(self, engine: str) -> bool:
        """Whether ``engine``'s events are heard (its matches are exact)."""
        return engine in self._engines

    def detach(self, engine: str) -> None:
        """``engine``'s events stopped (its subscriber closed): the learned index matches it again."""
        self._engines.pop(engine, None)

    def apply(self, engine: str, seq: int, batch: Any) -> Applied:
        """One published batch (``[ts, events, dp_rank]`` as msgpack decodes it) with its sequence number.
        ValueError when it is not a batch."""
        if not isinstance(batch, list | tuple) or len(batch) < 2 or not isinstance(batch[1], list | tuple):
            raise ValueError("a KV event batch is [ts, events, data_parallel_rank]")
        state = self._engines.setdefault(engine, _Engine())
        resync = None
        if state.seq is not None and seq != state.seq + 1:
            resync = f"sequence {state.seq} -> {seq}: " + ("publisher restarted" if seq <= state.seq else "gap")
            state.clear()
            state.cleared += 1
        state.seq = seq
        stored = removed = unresolved = 0
        events = [e for e in batch[1] if isinstance(e, dict)]
        # stores that name every block first: a recurrent group's sparse store resolves its hashes through them
        events.sort(key=lambda e: e.get("type") == "BlockStored" and not _dense(e))
        for ev in events:
            kind = ev.get("type")
            if kind == "AllBlocksCleared":
                state.clear()
            elif kind == "BlockStored":
                s, u = self._stored(state, ev)
                stored, unresolved = stored + s, unresolved + u
            elif kind == "BlockRemoved":
                removed += self._removed(state, ev)
        while len(state.held) > self.capacity_blocks:  # a safety bound: the engine's own cache is bounded
            state.held.popitem(last=False)
        return Applied(stored, removed, unresolved, resync)

    def _stored(self, state: _Engine, ev: Mapping[str, Any]) -> tuple[int, int]:
        hashes, tokens = list(ev.get("block_hashes") or ()), list(ev.get("token_ids") or ())
        group, size = int(ev.get("group_idx") or 0), int(ev.get("block_size") or 0)
        if size != self.block_size or not hashes:
            return 0, len(hashes)
        bit = 1 << group
        dense = len(hashes) == len(tokens) // size
        kind = ev.get("kv_cache_spec_kind")
        if kind is not None:
            recurrent = kind in RECURRENT_KINDS
        else:  # vLLM 0.32 leaves it out: a store that skips blocks is a recurrent group's ("align" mode)
            recurrent = bool(state.recurrent & bit) or (self.recurrent and not dense)
        if recurrent:
            state.recurrent |= bit
        elif dense and (len(hashes) > 1 or not self.recurrent):
            state.attention |= bit
        parent = ev.get("parent_block_hash")
        start = b"" if parent is None else state.keys.get(parent)
        ours: list[bytes | None]
        if dense and start is not None:
            ours = list(block_hashes(tokens, size, parent=start))
        else:
            ours = [state.keys.get(h) for h in hashes]
        n = 0
        for h, key in zip(hashes, ours, strict=True):
            if key is None:
                continue
            state.keys[h] = key
            state.held[key] = state.held.get(key, 0) | bit
            n += 1
        return n, len(hashes) - n

    def _removed(self, state: _Engine, ev: Mapping[str, Any]) -> int:
        bit = 1 << int(ev.get("group_idx") or 0)
        n = 0
        for h in ev.get("block_hashes") or ():
            key = state.keys.get(h)
            if key is None:
                continue
            left = state.held.get(key, 0) & ~bit
            if left:
                state.held[key] = left
            else:
                state.held.pop(key, None)
                state.keys.pop(h, None)
            n += 1
        return n

    # --- the lookups ----------------------------------------------------------------------------------------
    def exact_hit(self, engine: str, hashes: Sequence[bytes]) -> tuple[int, int]:
        """(usable hit, attention hit) of ``engine`` in tokens from its events (both 0 when it is not live)."""
        state = self._engines.get(engine)
        if state is None:
            return 0, 0
        need = state.attention
        if not need:
            return 0, 0
        recurrent = self.recurrent or bool(state.recurrent)
        held, attention, checkpoints = state.held.get, 0, []
        for i, h in enumerate(hashes):
            groups = held(h, 0)
            if groups & need != need:
                break
            attention = i + 1
            if recurrent and state.recurrent and groups & state.recurrent == state.recurrent:
                checkpoints.append(attention)
        blocks = checkpoint_hit(attention, checkpoints) if recurrent else attention
        return blocks * self.block_size, attention * self.block_size

    def match(self, hashes: Sequence[bytes]) -> dict[str, int]:
        """Instance -> usable cached prefix tokens: exact for the engines whose events arrive, learned for others
        (for a hybrid, at the checkpoints learned with them)."""
        out = {k: v for k, v in self.learned.match(hashes).items() if k not in self._engines}
        if self.recurrent:
            for name, hit in list(out.items()):
                points = (k for k in range(1, hit // self.block_size + 1) if (name, hashes[k - 1]) in self._points)
                out[name] = checkpoint_hit(hit // self.block_size, points) * self.block_size
                if not out[name]:
                    del out[name]
        for name in self._engines:
            hit = self.exact_hit(name, hashes)[0]
            if hit:
                out[name] = hit
        return out

    def insert(self, hashes: Sequence[bytes], instance: str) -> None:
        """What the router routed (the learned index; the fallback of an engine without events). For a hybrid also
        where vLLM's "align" mode saves the state: where the prompt diverged from what the instance held, and at its
        last whole block."""
        if self.recurrent and hashes:
            held = self.learned.match(hashes).get(instance, 0) // self.block_size
            for k in (held, len(hashes)) if 0 < held < len(hashes) else (len(hashes),):
                key = (instance, hashes[k - 1])
                if key in self._points:
                    self._points.move_to_end(key)
                else:
                    self._points[key] = None
            while len(self._points) > self.capacity_blocks:
                self._points.popitem(last=False)
        self.learned.insert(hashes, instance)

    def forget(self, instances: Iterable[str]) -> None:
        gone = set(instances)
        self.learned.forget(gone)
        self._points = OrderedDict((k, None) for k in self._points if k[0] not in gone)
        for name in gone:
            self._engines.pop(name, None)

    def retarget(self, gone: Iterable[str], recurrent: bool) -> None:
        """A new configuration: instances that left are forgotten; a hybrid's hits resume only at checkpoints."""
        self.forget(gone)
        if recurrent != self.recurrent:
            self._points.clear()
        self.recurrent = recurrent

    def cleared(self, engine: str) -> int:
        """Times ``engine``'s holdings were cleared for a gap or a restart of its publisher."""
        state = self._engines.get(engine)
        return state.cleared if state is not None else 0

    def held_blocks(self, engine: str) -> int:
        state = self._engines.get(engine)
        return len(state.held) if state is not None else 0


def _dense(ev: Mapping[str, Any]) -> bool:
    size = int(ev.get("block_size") or 0)
    return size > 0 and len(ev.get("block_hashes") or ()) == len(ev.get("token_ids") or ()) // size
