"""The router's prefix index: leading-prefix matches per instance, a bounded size, recent blocks kept."""

from __future__ import annotations

import random

from prfaas_core.request.tokens import PrefixIndex, block_hashes

BS = 4


def _blocks(*ids: int) -> list[bytes]:
    return block_hashes(list(ids), BS)


def test_a_match_is_the_leading_blocks_each_instance_holds() -> None:
    idx = PrefixIndex(1000, BS)
    shared = list(range(8))  # two blocks
    a = block_hashes([*shared, *range(100, 108)], BS)
    b = block_hashes([*shared, *range(200, 204)], BS)
    idx.insert(a, "a")
    idx.insert(b, "b")
    assert idx.match(a) == {"a": 16, "b": 8}
    assert idx.match(b) == {"a": 8, "b": 12}
    assert idx.match(_blocks(*range(300, 308))) == {}
    idx.insert(a[:1], "c")
    assert idx.match(a) == {"a": 16, "b": 8, "c": 4}


def test_the_index_never_holds_more_than_its_capacity_and_keeps_what_was_used_lately() -> None:
    idx = PrefixIndex(40, BS)
    hot = _blocks(*range(40))  # 10 blocks, inserted again after every cold prompt
    for k in range(30):
        idx.insert(_blocks(*range(1000 * (k + 1), 1000 * (k + 1) + 40)), f"cold-{k % 3}")
        idx.insert(hot, "hot")
        assert len(idx) <= 40
    assert idx.match(hot) == {"hot": 40}
    assert idx.match(_blocks(*range(1000, 1040))) == {}  # the first cold prompt is long gone


def test_forgotten_instances_leave_every_block_and_their_bit_is_reused() -> None:
    idx = PrefixIndex(1000, BS)
    h = _blocks(*range(16))
    idx.insert(h, "a")
    idx.insert(h, "b")
    idx.forget(["a"])
    assert idx.match(h) == {"b": 16}
    idx.forget(["b"])
    assert idx.match(h) == {} and len(idx) == 0
    idx.insert(h[:2], "c")  # takes a freed bit: no stale holder appears
    assert idx.match(h) == {"c": 8}


def _scanned(idx: PrefixIndex, hashes: list[bytes]) -> dict[str, int]:
    """The match as a block-by-block scan finds it (what the bisection must equal)."""
    out: dict[str, int] = {}
    alive: set[str] | None = None
    for i, h in enumerate(hashes):
        mask = idx._young.get(h) or idx._old.get(h, 0)
        held = {name for name, bit in idx._bit.items() if mask & bit}
        for name in (alive or set()) - held:
            out.setdefault(name, i * BS)
        alive = held if alive is None else alive & held
        if not alive:
            return out
    for name in alive or ():
        out[name] = len(hashes) * BS
    return out


def test_the_bisected_match_equals_a_scan_through_evictions_shared_prefixes_and_forgets() -> None:
    rng = random.Random(7)
    idx = PrefixIndex(300, BS)  # small: generations roll mid-prompt all the time
    trunks = [[rng.randrange(1 << 20) for _ in range(BS * rng.randint(5, 60))] for _ in range(6)]
    prompts: list[list[bytes]] = []
    for step in range(3000):
        trunk = rng.choice(trunks)
        cut = BS * rng.randint(0, len(trunk) // BS)
        tail = [rng.randrange(1 << 20) for _ in range(BS * rng.randint(0, 40))]
        h = block_hashes(trunk[:cut] + tail, BS)
        prompts.append(h)
        if rng.random() < 0.02:
            idx.forget([f"i{rng.randrange(8)}"])
        else:
            idx.insert(h[: rng.randint(0, len(h))], f"i{rng.randrange(8)}")
        assert len(idx) <= 300
        probe = rng.choice(prompts)
        assert idx.match(probe) == _scanned(idx, probe), step
