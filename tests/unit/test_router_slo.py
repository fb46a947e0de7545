"""Routers judge each request's TTFT against its own objective (RouterConfig.slo); the objective is one rule,
on the whole prompt as the client sent it, in the router, the simulator and the load client."""

from __future__ import annotations

from prometheus_client import generate_latest

from prfaas_core import names
from prfaas_core.api import RouterConfig, SloSpec
from prfaas_core.request.slo import ttft_objective_s
from prfaas_core.sim.arrivals import SimRequest
from prfaas_core.sim.results import RunResult
from prfaas_local.load import Result
from prfaas_router.state.metrics import RouterMetrics, judge_ttft, sample_sum


def _count(m: RouterMetrics, route: str, result: str) -> float:
    text = generate_latest(m.registry).decode()
    return sample_sum(text, names.METRIC_ROUTER_TTFT_SLO, {"route": route, "result": result}) or 0.0


def test_the_objective_grows_with_the_prompt() -> None:
    slo = SloSpec.model_validate({"ttft": {"baseSeconds": 2.0, "secondsPerKTokens": 0.5}})
    assert ttft_objective_s(slo, 0) == 2.0
    assert ttft_objective_s(slo, 4096) == 4.0


def test_a_cached_prefix_does_not_move_the_objective() -> None:
    """A 50K-token prompt with 48K cached is judged on its 50K tokens (11.8 s under the default SLO) by the
    router's metrics, the load client and the simulator alike — not on its 2K uncached ones (2.4 s)."""
    slo = SloSpec()
    assert ttft_objective_s(slo, 50 * 1024) == 12.0
    ttft_s = 5.0  # beyond the uncached-length objective, within the whole prompt's
    m = RouterMetrics()
    judge_ttft(m, slo, "local", ttft_s, 50 * 1024)
    assert _count(m, "local", "met") == 1
    client = Result(0, input_tokens=50 * 1024, uncached_tokens=2 * 1024, output_tokens=1, status=200, ttft_s=ttft_s)
    client.done = True
    assert client.meets(slo) and client.miss_reason(slo) is None and not client.missed(slo, 0.0, 1.0)

    class Finished:  # what the simulator records of a finished request
        spec = SimRequest(0, 0.0, input_tokens=50 * 1024, output_tokens=1, session=0, shared_prefix_tokens=48 * 1024)
        first_token_s = ttft_s
        done_s = ttft_s
        remote = False

    sim = RunResult("cached", 10.0, 1)
    sim.record(Finished(), slo)
    assert sim.slo_ok == [True]


def test_each_request_is_judged_against_its_own_length() -> None:
    m = RouterMetrics()
    slo = SloSpec.model_validate({"ttft": {"baseSeconds": 2.0, "secondsPerKTokens": 0.5}})
    judge_ttft(m, slo, "remote", 3.0, 4096)  # 3 s for 4K tokens: within its 4 s
    judge_ttft(m, slo, "local", 3.0, 1024)  # 3 s for 1K tokens: over its 2.5 s
    judge_ttft(m, slo, "local", 2.4, 1024)
    assert _count(m, "remote", "met") == 1
    assert _count(m, "local", "missed") == 1
    assert _count(m, "local", "met") == 1


def test_without_an_slo_only_the_histogram_moves() -> None:
    m = RouterMetrics()
    judge_ttft(m, None, "local", 30.0, 10)
    assert _count(m, "local", "missed") == 0
    text = generate_latest(m.registry).decode()
    assert sample_sum(text, names.METRIC_ROUTER_TTFT_SECONDS + "_count", {"route": "local"}) == 1


def test_router_config_carries_the_slo() -> None:
    config = RouterConfig.model_validate(
        {
            "pdCluster": "pd",
            "thresholdMinTokens": 0,
            "model": {"measured": {"points": [{"lengthTokens": 1, "kvMiB": 1}, {"lengthTokens": 2, "kvMiB": 2}]}},
            "slo": {"ttft": {"baseSeconds": 1.5}, "objectiveRatio": 0.99},
        }
    )
    assert config.slo is not None and config.slo.ttft.base_seconds == 1.5 and config.slo.objective_ratio == 0.99
