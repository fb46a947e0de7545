"""The circuit breaker's state machine."""

from __future__ import annotations

from prfaas_core.policy.breaker import Breaker, BreakerParams

P = BreakerParams(failure_threshold=3, open_s=10.0)


def test_opens_after_consecutive_failures_and_success_resets() -> None:
    b = Breaker()
    b = b.on_failure(0.0, P, "5xx").on_failure(1.0, P, "5xx")
    assert b.mode == "closed" and b.failures == 2
    b = b.on_success()
    assert b.failures == 0
    b = b.on_failure(2.0, P, "a").on_failure(2.1, P, "b").on_failure(2.2, P, "timeout")
    assert b.mode == "open" and "3 consecutive failures, last: timeout" in b.reason


def test_open_rejects_until_the_window_then_one_probe() -> None:
    b = Breaker("open", 3, 100.0)
    ok, b = b.allows(105.0, P)
    assert not ok and b.mode == "open"
    ok, b = b.allows(110.0, P)
    assert ok and b.mode == "half-open"
    ok2, b = b.allows(110.1, P)
    assert not ok2  # one probe at a time
    assert b.on_success().mode == "closed"
    reopened = b.on_failure(111.0, P, "5xx")
    assert reopened.mode == "open" and reopened.opened_at_s == 111.0
