"""The fluid link: max-min fair sharing never exceeds capacity, pipelining with the prefill, live cuts."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prfaas_core.sim.events import EventQueue
from prfaas_core.sim.fluid_link import FluidLink

GB = 1e9  # bytes


def make(capacity: float, one_way: float = 0.0) -> tuple[EventQueue, FluidLink, dict[str, float]]:
    ev = EventQueue()
    link = FluidLink(ev, capacity, one_way)
    return ev, link, {}


def done_into(ev: EventQueue, out: dict[str, float]):  # type: ignore[no-untyped-def]
    return lambda key: out.__setitem__(key, ev.now_s)


def test_two_backlogged_streams_share_equally_and_finish_together() -> None:
    ev, link, done = make(1 * GB)
    ev.at(0.0, lambda _: link.start("a", 1 * GB, 0.0, 0.0, done_into(ev, done)))
    ev.at(0.0, lambda _: link.start("b", 1 * GB, 0.0, 0.0, done_into(ev, done)))
    ev.run_until(1.0)
    assert link.stream_rates() == {"a": pytest.approx(0.5 * GB), "b": pytest.approx(0.5 * GB)}
    ev.run_until(100.0)
    assert done == {"a": pytest.approx(2.0), "b": pytest.approx(2.0)}
    assert link.bytes_sent(100.0) == pytest.approx(2 * GB)


def test_a_stream_cannot_finish_before_its_prefill_ends() -> None:
    # 1 GB produced over [0, 4] s on a link 100x faster: it keeps up with the prefill and ends with it
    ev, link, done = make(25 * GB, one_way=0.005)
    ev.at(0.0, lambda _: link.start("r", 1 * GB, 0.0, 4.0, done_into(ev, done)))
    ev.run_until(2.0)
    assert link.stream_rates()["r"] == pytest.approx(0.25 * GB)  # the production rate
    assert link.bytes_sent(2.0) == pytest.approx(0.5 * GB)  # only what the first half of the layers produced
    ev.run_until(10.0)
    assert done["r"] == pytest.approx(4.0 + 0.005)


def test_a_slow_link_makes_the_stream_outlast_its_prefill() -> None:
    ev, link, done = make(0.1 * GB)
    ev.at(0.0, lambda _: link.start("r", 1 * GB, 0.0, 4.0, done_into(ev, done)))
    ev.run_until(100.0)
    assert done["r"] == pytest.approx(10.0)  # 1 GB at 0.1 GB/s, production never the limit


def test_water_filling_gives_a_capped_stream_its_rate_and_the_rest_to_the_others() -> None:
    ev, link, done = make(1 * GB)
    ev.at(0.0, lambda _: link.start("slow", 0.1 * GB, 0.0, 1.0, done_into(ev, done)))  # 0.1 GB/s production
    ev.at(0.0, lambda _: link.start("bulk", 10 * GB, 0.0, 0.0, done_into(ev, done)))
    ev.run_until(0.5)
    rates = link.stream_rates()
    assert rates["slow"] == pytest.approx(0.1 * GB)
    assert rates["bulk"] == pytest.approx(0.9 * GB)
    assert sum(rates.values()) == pytest.approx(1 * GB)


def test_a_cut_slows_streams_in_flight_and_drops_nothing() -> None:
    ev, link, done = make(10 * GB)
    for k in range(4):
        ev.at(0.0, lambda _, k=k: link.start(k, 5 * GB, 0.0, 0.0, done_into(ev, done)))
    ev.at(1.0, lambda _: link.set_capacity(1 * GB))  # 10 GB sent by now, 10 GB left at 1 GB/s
    ev.run_until(1.5)
    assert sum(link.stream_rates().values()) == pytest.approx(1 * GB)
    ev.run_until(100.0)
    assert sorted(done) == [0, 1, 2, 3]
    assert max(done.values()) == pytest.approx(11.0)
    assert link.bytes_sent(100.0) == pytest.approx(20 * GB)


def test_a_stream_that_fell_behind_catches_up_then_follows_its_prefill() -> None:
    ev, link, done = make(1 * GB)
    # bulk hogs half the link: "r" (2 GB/s production) falls behind; when bulk ends it catches up
    ev.at(0.0, lambda _: link.start("bulk", 0.5 * GB, 0.0, 0.0, done_into(ev, done)))
    ev.at(0.0, lambda _: link.start("r", 8 * GB, 0.0, 10.0, done_into(ev, done)))
    ev.run_until(100.0)
    assert done["bulk"] == pytest.approx(1.0)
    assert done["r"] == pytest.approx(10.0, rel=1e-6)  # catches up (0.8 GB/s production < 1 GB/s link)
    assert link.bytes_sent(100.0) == pytest.approx(8.5 * GB)


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=0, max_value=10_000))
def test_random_traffic_never_exceeds_capacity_and_conserves_bytes(seed: int) -> None:
    rng = random.Random(seed)
    ev, link, done = make(rng.uniform(0.5, 5) * GB, one_way=0.01)
    sizes: dict[int, float] = {}
    for k in range(rng.randint(1, 25)):
        t0 = rng.uniform(0, 20)
        dur = rng.choice([0.0, rng.uniform(0.1, 8)])
        size = rng.uniform(0.01, 3) * GB
        sizes[k] = size
        ev.at(t0, lambda _, k=k, t0=t0, d=dur, s=size: link.start(k, s, t0, t0 + d, done_into(ev, done)))
    for t in (5.0, 12.0):
        ev.at(t, lambda _: link.set_capacity(rng.uniform(0.2, 5) * GB))
    ev.run_until(10_000.0)
    assert set(done) == set(sizes)  # every stream finished
    assert link.max_over_capacity <= 1e-6 * link.capacity
    assert link.bytes_sent(10_000.0) == pytest.approx(sum(sizes.values()), rel=1e-9)
