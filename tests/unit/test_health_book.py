"""The router's engine health over consecutive probes: failures and slowness both need to persist to count."""

from __future__ import annotations

from prfaas_core.policy.engine_load import EngineLoad
from prfaas_router.state.signals import SLOW_PROBES, HealthBook


def test_one_slow_probe_does_not_make_an_engine_slow() -> None:
    book = HealthBook()
    for seconds in (0.01, 0.02, 1.8):  # busy with a prefill when the last probe came
        load = book.probed("pdp0", EngineLoad(), seconds)
    assert load.probe_s == 0.01 and load.healthy


def test_an_engine_slow_at_every_probe_is_slow() -> None:
    book = HealthBook()
    book.probed("pdp0", EngineLoad(), 0.01)
    for seconds in [1.2, 0.9, 1.5][:SLOW_PROBES]:
        load = book.probed("pdp0", EngineLoad(), seconds)
    assert load.probe_s == 0.9
    assert book.probed("pdp0", EngineLoad(), 0.02).probe_s == 0.02  # fast again at its next good probe


def test_failures_count_only_in_a_row() -> None:
    book = HealthBook()
    good = book.probed("pdd", EngineLoad(running=2), 0.01)
    assert book.failed("pdd", "/metrics ReadTimeout", 3) == good
    assert book.failed("pdd", "/metrics ReadTimeout", 3) == good
    book.probed("pdd", EngineLoad(), 0.01)
    assert book.failed("pdd", "/metrics ReadTimeout", 3).healthy
    assert book.failed("pdd", "/metrics ReadTimeout", 3).healthy
    assert not book.failed("pdd", "/metrics ReadTimeout", 3).healthy
    assert book.take_transitions() == [("pdd", False, "3 consecutive failed probe(s), last: /metrics ReadTimeout")]
