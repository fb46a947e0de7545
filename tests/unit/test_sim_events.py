"""The simulator's event queue: a batch given up front (a run's arrivals) runs in the same order as the same events
given one by one, ties by scheduling order included, and a callback that clears the queue stops the batch too."""

from __future__ import annotations

import random

from prfaas_core.sim.events import EventQueue


def _run(batched: bool, times: list[float], later: list[float]) -> list[tuple[float, str]]:
    q = EventQueue()
    seen: list[tuple[float, str]] = []

    def record(name: str) -> None:
        seen.append((q.now_s, name))
        if name.startswith("a"):  # each arrival schedules work of its own, some at the same instant as others
            q.at(q.now_s + later[int(name[1:]) % len(later)], record, f"w{name[1:]}")

    events = [(t, record, f"a{i}") for i, t in enumerate(times)]
    if batched:
        q.at_all(events)
    else:
        for t, cb, arg in events:
            q.at(t, cb, arg)
    q.at(2.0, record, "tick")
    q.run_until(5.0)
    q.run_until(1e9)  # a second call resumes where the first stopped
    return seen


def test_a_batch_runs_in_the_order_of_the_same_events_given_one_by_one() -> None:
    rng = random.Random(3)
    times = [float(rng.randint(0, 12)) for _ in range(300)] + [-1.0]  # ties, and a time before now (runs at once)
    later = [0.0, 1.0, 2.5, 0.5]
    one_by_one = _run(False, times, later)
    assert _run(True, times, later) == one_by_one
    assert len(one_by_one) == 2 * len(times) + 1
    assert [t for t, _ in one_by_one] == sorted(t for t, _ in one_by_one)


def test_clearing_from_a_callback_drops_the_rest_of_the_batch() -> None:
    q = EventQueue()
    seen: list[int] = []

    def record(i: int) -> None:
        seen.append(i)
        if i == 3:
            q.clear()

    q.at_all((float(i), record, i) for i in range(10))
    q.at(7.5, record, 99)
    q.run_until(100.0)
    assert seen == [0, 1, 2, 3]
    assert len(q) == 0
    assert q.events_run == 4
