"""The circuit breaker's state machine: examples, then properties over arbitrary call sequences."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prfaas_core.policy.breaker import Breaker, BreakerBoard, BreakerParams

P = BreakerParams(failure_threshold=3, open_s=10.0, max_probes=1, probe_timeout_s=30.0)


def test_opens_after_consecutive_failures_and_success_resets() -> None:
    b = Breaker()
    b = b.on_failure(0.0, P, "5xx").on_failure(1.0, P, "5xx")
    assert b.mode == "closed" and b.failures == 2
    b = b.on_success()
    assert b.failures == 0
    b = b.on_failure(2.0, P, "a").on_failure(2.1, P, "b").on_failure(2.2, P, "timeout")
    assert b.mode == "open" and "3 consecutive failures, last: timeout" in b.reason


def test_a_trip_opens_at_once_and_a_probe_after_the_window_closes_it() -> None:
    """A router trips the breaker when its remote's status endpoint stops answering (a cut link): remote use has
    stopped, and the breaker says so, whatever the failure threshold."""
    board = BreakerBoard()
    board.ensure(["prfaas"])
    board.tripped("prfaas", 50.0, "3 status polls failed")
    assert board.is_open("prfaas") and "3 status polls failed" in board.reason("prfaas")
    board.tripped("prfaas", 55.0, "again")  # an open breaker stays as it was opened
    assert board.get("prfaas").opened_at_s == 50.0
    assert [(t.before, t.after) for t in board.take_transitions()] == [("closed", "open")]
    assert not board.allows("prfaas", 59.0, P)
    assert board.allows("prfaas", 60.0, P)  # half-open: the first request after the link returns probes
    board.succeeded("prfaas")
    assert not board.is_open("prfaas")
    half = Breaker("half-open", 0, 0.0, (1.0,))
    assert half.trip(2.0, "down").mode == "open"


def test_open_rejects_until_the_window_then_one_probe() -> None:
    b = Breaker("open", 3, 100.0)
    ok, b = b.acquire(105.0, P)
    assert not ok and b.mode == "open"
    ok, b = b.acquire(110.0, P)
    assert ok and b.mode == "half-open"
    ok2, b = b.acquire(110.1, P)
    assert not ok2  # one probe at a time
    assert b.on_success().mode == "closed"
    reopened = b.on_failure(111.0, P, "5xx")
    assert reopened.mode == "open" and reopened.opened_at_s == 111.0


def test_asking_whether_the_remote_is_available_takes_no_probe() -> None:
    """The stuck-open finding: a short request that only *asks* must not consume the half-open probe."""
    board = BreakerBoard()
    for i in range(3):
        board.failed("r", float(i), P, "5xx")
    assert board.get("r").mode == "open"
    for _ in range(10):  # many short requests past the window: they only ask
        assert board.available("r", 20.0, P)
    assert board.get("r").mode == "open" and board.get("r").probes == ()
    ticket = board.acquire("r", 20.0, P)  # the long request that will use the remote
    assert ticket is not None and board.get("r").mode == "half-open"
    board.succeeded("r")
    assert board.get("r").mode == "closed"


def test_a_cancelled_probe_frees_its_slot_and_a_lost_one_expires() -> None:
    board = BreakerBoard()
    for i in range(3):
        board.failed("r", float(i), P, "5xx")
    ticket = board.acquire("r", 20.0, P)
    assert ticket is not None and board.acquire("r", 20.5, P) is None
    board.cancelled("r", ticket)  # the client went away mid-probe
    assert board.get("r").mode == "half-open" and board.acquire("r", 21.0, P) is not None
    # that second probe never reports: after probe_timeout_s its slot is free again
    assert board.acquire("r", 21.0 + P.probe_timeout_s - 1, P) is None
    assert board.acquire("r", 21.0 + P.probe_timeout_s, P) is not None


def test_probes_are_bounded() -> None:
    params = BreakerParams(failure_threshold=1, open_s=1.0, max_probes=3, probe_timeout_s=100.0)
    board = BreakerBoard()
    board.failed("r", 0.0, params, "x")
    got = [board.acquire("r", 2.0 + i * 0.01, params) for i in range(6)]
    assert sum(t is not None for t in got) == 3


def test_transitions_are_recorded_once_each() -> None:
    board = BreakerBoard()
    for i in range(3):
        board.failed("r", float(i), P, "5xx")
    board.acquire("r", 20.0, P)
    board.succeeded("r")
    board.succeeded("r")
    moves = [(t.before, t.after) for t in board.take_transitions()]
    assert moves == [("closed", "open"), ("open", "half-open"), ("half-open", "closed")]
    assert board.take_transitions() == []


def test_reload_keeps_state_only_for_an_unchanged_remote() -> None:
    board = BreakerBoard()
    board.ensure({"a": ("http://a", "l1"), "b": ("http://b", "l1")})
    for i in range(3):
        board.failed("a", float(i), P, "x")
        board.failed("b", float(i), P, "x")
    board.ensure({"a": ("http://a", "l1"), "b": ("http://b-new", "l1")})
    assert board.get("a").mode == "open"  # same remote: state kept
    assert board.get("b").mode == "closed"  # moved: a fresh breaker
    board.ensure({"b": ("http://b-new", "l1")})
    assert board.get("a").mode == "closed" and "a" not in board._breakers


# --- properties ---------------------------------------------------------------------------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(["fail", "succeed", "acquire", "cancel", "ask"]),
        st.floats(min_value=0.0, max_value=40.0, allow_nan=False),
    ),
    max_size=60,
)
PARAMS = st.builds(
    BreakerParams,
    failure_threshold=st.integers(1, 6),
    open_s=st.floats(0.5, 20.0),
    max_probes=st.integers(1, 4),
    probe_timeout_s=st.floats(1.0, 60.0),
)


def _run(board: BreakerBoard, ops: list[tuple[str, float]], params: BreakerParams) -> float:
    now = 0.0
    tickets: list[float] = []
    for op, dt in ops:
        now += dt
        if op == "fail":
            board.failed("r", now, params, "x")
        elif op == "succeed":
            board.succeeded("r")
        elif op == "acquire":
            t = board.acquire("r", now, params)
            if t is not None:
                tickets.append(t)
        elif op == "cancel" and tickets:
            board.cancelled("r", tickets.pop())
        else:
            board.available("r", now, params)
        b = board.get("r")
        assert len(b.probes) <= params.max_probes  # probes stay bounded
        assert b.mode == "half-open" or not b.probes
    return now


@settings(max_examples=300, deadline=None)
@given(OPS, PARAMS)
def test_no_sequence_leaves_it_open_while_probes_succeed(ops: list[tuple[str, float]], params: BreakerParams) -> None:
    """Whatever happened before (failures, lost or cancelled probes, requests that only asked), once the
    remote is healthy a request that uses it gets through within open_s + probe_timeout_s, and its success
    closes the breaker."""
    board = BreakerBoard()
    now = _run(board, ops, params)
    deadline = now + params.open_s + params.probe_timeout_s
    t = now
    while board.acquire("r", t, params) is None:
        t += 0.25
        assert t <= deadline, f"still refused at {t} (state {board.get('r')})"
    board.succeeded("r")
    assert board.get("r").mode == "closed"
    assert board.acquire("r", t, params) is not None


@settings(max_examples=200, deadline=None)
@given(OPS, PARAMS)
def test_asking_never_changes_the_state(ops: list[tuple[str, float]], params: BreakerParams) -> None:
    board = BreakerBoard()
    now = _run(board, ops, params)
    before = board.get("r")
    for i in range(5):
        board.available("r", now + i * params.open_s, params)
    assert board.get("r") == before
