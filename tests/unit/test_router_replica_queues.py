"""Router replicas share the PD prefill instances but each books only its own requests: a replica must not take an
instance for idle that the engine itself reports busy with the other replicas' work (3 routers over 2 gateways,
10 Gbps seed 1: 13 of 80 requests missed their TTFT locally at 0.388 req/s without it, 1 with it).
Real Runtime, no sockets: the engines' scraped load goes into the snapshot as the refresher puts it there."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from prfaas_core.api import RouterConfig
from prfaas_core.capacity.profiles import builtin_model_profiles
from prfaas_core.policy.engine_load import EngineLoad
from prfaas_router.state.config import compile_config
from prfaas_router.state.runtime import Runtime

ROLES = {"pd-0": "prefill", "pd-1": "prefill", "pd-2": "decode"}


def runtime() -> Runtime:
    doc: dict[str, Any] = {
        "pdCluster": "pd",
        "thresholdMinTokens": 1_000_000,
        "model": builtin_model_profiles()["internal-1t"],
        "endpoints": [{"name": n, "url": f"http://{n}", "role": r} for n, r in ROLES.items()],
    }
    return Runtime(compile_config(RouterConfig.model_validate(doc)))


def test_an_instance_busy_with_another_replicas_work_is_not_taken_for_idle() -> None:
    rt = runtime()
    with rt.prefill_queued("pd-0", 4.0):  # this replica's own request on pd-0: 4 s of work
        pass
    with rt.prefill_queued("pd-0", 4.0):
        # by its own books pd-1 is idle; the engine says 3 requests wait there (other replicas')
        rt.snapshot = replace(
            rt.snapshot, engines={"pd-0": EngineLoad(True, 0, 1, own=1), "pd-1": EngineLoad(True, 3, 0)}
        )
        plan = rt.route(20_000, [])
        assert plan.prefill is not None and plan.prefill.name == "pd-0", plan.prefill
        assert rt.queued_work_s("pd-1", rt.snapshot.engines["pd-1"]) > rt.queued_work_s(
            "pd-0", rt.snapshot.engines["pd-0"]
        )
        wait = rt.local_wait_s()
        assert wait is not None and wait >= 4.0  # no instance is idle: the local alternative waits
        assert rt.queued_work_s("pd-0", rt.snapshot.engines["pd-0"]) == 4.0  # its running one is this replica's
        # the engines idle again: the own books count, as before
        rt.snapshot = replace(rt.snapshot, engines={"pd-0": EngineLoad(), "pd-1": EngineLoad()})
        assert rt.local_wait_s() == 0.0 and rt.route(20_000, []).prefill.name == "pd-1"  # type: ignore[union-attr]


def test_a_scrape_that_saw_this_routers_own_request_does_not_count_it_again_once_it_is_over() -> None:
    """A scrape taken while this router's own request ran on pd-0 says one running; once that request is over
    the instance is idle, not busy for another mean prefill until the next scrape (a stale scrape once sent a
    short follow-up turn remote as a 'queue surge' on an idle engine)."""
    rt = runtime()
    mark = rt.own_mark("pd-0")
    with rt.prefill_queued("pd-0", 4.0):
        seen = rt.own_seen("pd-0", mark)  # the scrape began before the request and answered while it ran
        assert seen == 1
        scraped = EngineLoad(True, 0, 1, own=seen)
        assert rt.queued_work_s("pd-0", scraped) == 4.0
    assert rt.queued_work_s("pd-0", scraped) == 0.0
    rt.snapshot = replace(rt.snapshot, engines={"pd-0": scraped, "pd-1": EngineLoad()})
    assert rt.local_wait_s() == 0.0
    # a scrape begun while two were in flight counts both as this router's, even if one ended before it answered
    with rt.prefill_queued("pd-0", 4.0), rt.prefill_queued("pd-0", 4.0):
        mark = rt.own_mark("pd-0")
    with rt.prefill_queued("pd-0", 4.0):
        assert rt.own_seen("pd-0", mark) == 3
        # one more than this router's own is running there: another replica's, at the mean prefill time
        assert rt.queued_work_s("pd-0", EngineLoad(True, 1, 3, own=3)) == 4.0 + 4.0
