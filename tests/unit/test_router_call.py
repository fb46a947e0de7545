"""The router's per-request object (prfaas_router.path.call.Call) counts a request's outcome once: the first report
wins, a later one (a stream answered ``ok`` and then cancelled while closing) is not counted again."""

from __future__ import annotations

from prfaas_router.path.call import Call
from prfaas_router.state.metrics import RouterMetrics
from prfaas_router.state.security import RequestIds


def _count(m: RouterMetrics, route: str, outcome: str) -> float:
    value = m.registry.get_sample_value("prfaas_router_requests_total", {"route": route, "outcome": outcome})
    return value or 0.0


def test_the_first_outcome_is_counted_and_no_other() -> None:
    m = RouterMetrics()
    call = Call(RequestIds("k", "trace"), m, "/v1/completions", {}, 10, 0.0)
    assert call.key == "k" and call.outcome is None
    assert call.report("ok", "remote") is True
    assert call.report("cancelled", "remote") is False
    assert call.report("error", "none") is False
    assert call.outcome == "ok"
    assert _count(m, "remote", "ok") == 1
    assert _count(m, "remote", "cancelled") == 0 and _count(m, "none", "error") == 0
