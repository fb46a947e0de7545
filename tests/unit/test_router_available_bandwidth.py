"""A link's ``availableBandwidth``: Measured (the default) bounds the capacity by what the router's KV pulls achieve;
Configured never lowers it. The same late pulls, on the router's Runtime with a stepped clock (no sockets): the
measured link is squeezed (a long prompt's KV is paced down to the squeezed cap, and the gateway's window for it
moves out), the guaranteed one still streams it at full speed.
Why it exists: engines on one host, or a committed-rate link, where a decode engine slow to start its pulls (CPU
vLLM on a loaded machine) is not the link's doing."""

from __future__ import annotations

from typing import Any

import pytest

from prfaas_core.api import RouterConfig
from prfaas_core.capacity.profiles import builtin_model_profiles
from prfaas_router.state.config import compile_config
from prfaas_router.state.runtime import GUARANTEED, Runtime

LINK = "a-to-b"
LONG = 200_000


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def runtime(available: str | None) -> tuple[Runtime, Clock]:
    link: dict[str, Any] = {"name": LINK, "capacityGbps": 100}
    if available is not None:
        link["availableBandwidth"] = available
    doc: dict[str, Any] = {
        "pdCluster": "pd",
        "thresholdMinTokens": 20_000,
        "model": builtin_model_profiles()["internal-1t"],
        "endpoints": [
            {"name": "pd-0", "url": "http://pd-0", "role": "prefill"},
            {"name": "pd-1", "url": "http://pd-1", "role": "decode"},
        ],
        "links": [link],
        "remotes": [{"name": "prfaas", "url": "http://gw", "link": LINK}],
    }
    clock = Clock()
    rt = Runtime(compile_config(RouterConfig.model_validate(doc)), clock=clock)
    return rt, clock


def late_pulls(rt: Runtime, clock: Clock, n: int = 6) -> None:
    """``n`` remote KV streams, each pulled in ~0.1 s but the last ones taking 4 s (the decode slow to pull)."""
    for i in range(n):
        key = f"r{i}"
        rt.start_transfer(LINK, key, 4e7, 0.005)
        with rt.decoding("pd-1", pull_key=key):
            clock.now += 0.1 if i < 2 else 4.0
            rt.finish_transfer(key, pulled=True)
        clock.now += 0.2
        rt.estimate_links({})


def test_the_default_is_measured() -> None:
    assert (
        RouterConfig.model_validate(
            {
                "pdCluster": "pd",
                "thresholdMinTokens": 0,
                "model": builtin_model_profiles()["internal-1t"],
                "links": [{"name": LINK, "capacityGbps": 1}],
            }
        )
        .links[0]
        .available_bandwidth
        == "Measured"
    )


@pytest.mark.parametrize(("available", "squeezed"), [(None, True), ("Measured", True), ("Configured", False)])
def test_late_pulls_squeeze_only_a_measured_link(available: str | None, squeezed: bool) -> None:
    rt, clock = runtime(available)
    late_pulls(rt, clock)
    got = rt.available[LINK]
    assert (got.source != "configured") is squeezed, got
    decision = rt.route(LONG, []).decision
    assert decision.target == "remote", decision.reason
    cap = rt.link_params(LINK).cap_gbps
    if squeezed:
        assert rt.link_params(LINK).capacity_gbps < 1 and decision.egress_gbps <= cap, (decision.reason, cap)
    else:
        assert got == GUARANTEED and rt.link_params(LINK).capacity_gbps == 100
        assert decision.egress_gbps > 1, decision.reason


def test_an_invalid_value_names_the_field() -> None:
    doc = {
        "pdCluster": "pd",
        "thresholdMinTokens": 0,
        "model": builtin_model_profiles()["internal-1t"],
        "links": [{"name": LINK, "capacityGbps": 1, "availableBandwidth": "Sometimes"}],
    }
    with pytest.raises(ValueError, match="availableBandwidth"):
        RouterConfig.model_validate(doc)
