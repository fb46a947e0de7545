"""The per-request values' plumbing: frozen values made by :func:`quick_init`, reasons formatted when read."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from prfaas_core.policy.frozen import quick_init
from prfaas_core.policy.link_state import LinkParams, Transfer, admit
from prfaas_core.policy.reasons import text


@quick_init
@dataclasses.dataclass(frozen=True)
class _Point:
    x: float
    y: int = 3
    tags: tuple[str, ...] = dataclasses.field(default_factory=tuple)
    extra: list[int] = dataclasses.field(default_factory=list)


def test_quick_init_keeps_the_dataclass_behaviour() -> None:
    p = _Point(1.5)
    assert (p.x, p.y, p.tags, p.extra) == (1.5, 3, (), [])
    assert p == _Point(1.5, 3, (), []) and p != _Point(1.5, 4)
    assert _Point(1.5).extra is not _Point(1.5).extra  # a factory per instance, as dataclasses does
    assert _Point(x=2.0, extra=[1]).extra == [1]
    assert repr(_Point(1.0, 2)) == "_Point(x=1.0, y=2, tags=(), extra=[])"
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 2.0  # type: ignore[misc]
    assert dataclasses.replace(p, y=7) == _Point(1.5, 7)
    assert pickle.loads(pickle.dumps(_Point(1.0, 2, ("t",)))) == _Point(1.0, 2, ("t",))
    with pytest.raises(TypeError):
        _Point()  # type: ignore[call-arg]


def test_quick_init_transfer_same_as_generated() -> None:
    t = Transfer(10.0, 2.0, 3.0, 1, 0.5, None)
    assert dataclasses.astuple(t) == (10.0, 2.0, 3.0, 1, 0.5, None)
    assert (t.end_s, t.stream_start_s, t.stream_end_s) == (5.0, 2.5, 5.5)
    assert hash(t) == hash(Transfer(10.0, 2.0, 3.0, 1, 0.5)) and {t: 1}[Transfer(10.0, 2.0, 3.0, 1, 0.5)] == 1


def test_quick_init_refuses_what_it_cannot_make() -> None:
    @dataclasses.dataclass
    class Mutable:
        x: int

    @dataclasses.dataclass(frozen=True)
    class Checked:
        x: int

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class KeywordOnly:
        x: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Slotted:
        x: int

    for cls in (Mutable, Checked, KeywordOnly, Slotted):
        with pytest.raises(TypeError, match="quick_init"):
            quick_init(cls)


def test_reason_text_is_the_f_string_text() -> None:
    basis = ("abundant: uncached {} = total {} - best prefix {}", 1200, 5000, 3800)
    head = ("{} > t {}", basis, 1000)
    why = ("{}: remote prefill; {}", head, ("projected egress {:.2f} <= cap {:.2f} Gbps", 3.14159, 8.0))
    expected = (
        f"{'abundant: uncached 1200 = total 5000 - best prefix 3800'} > t {1000}: remote prefill; "
        f"projected egress {3.14159:.2f} <= cap {8.0:.2f} Gbps"
    )
    assert text(why) == expected and text("plain") == "plain"
    verdict = admit(2.0, 7.5, LinkParams("l", 8.0))
    cap = LinkParams("l", 8.0).cap_gbps  # (the usable cap: capacity x max utilisation)
    assert verdict.reason == f"projected egress {9.5:.2f} Gbps would exceed the cap {cap:.2f} Gbps"
