"""A gateway exports no router-only series: its ``t`` would show as a false ``t = 0`` instance on the dashboard's
per-instance panels (seen in ``prfaas up``'s dashboard picture: a flat line at 0 next to the router's ``t``)."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import generate_latest

from prfaas_core import names
from prfaas_core.api import RouterConfig
from prfaas_core.capacity.profiles import builtin_model_profiles
from prfaas_router.edge.app import METRICS, create_app

ROUTER_ONLY = (
    names.METRIC_ROUTER_THRESHOLD_TOKENS,
    names.METRIC_ROUTER_UNCACHED_TOKENS,
    names.METRIC_ROUTER_TTFT_SLO_OBJECTIVE,
)


def config(mode: str) -> RouterConfig:
    doc: dict[str, Any] = {
        "pdCluster": "prfaas-h200" if mode == "gateway" else "pd",
        "mode": mode,
        "thresholdMinTokens": 20_000,
        "model": builtin_model_profiles()["internal-1t"],
        "endpoints": [{"name": "e-0", "url": "http://e-0", "role": "prefill"}],
    }
    if mode == "gateway":
        doc["gateway"] = {"prefillCluster": "prfaas-h200"}
    return RouterConfig.model_validate(doc)


def exported(mode: str) -> set[str]:
    app = create_app(config(mode), allow_insecure_gateway=True)
    text = generate_latest(app[METRICS].registry).decode()
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


@pytest.mark.parametrize("name", ROUTER_ONLY)
def test_the_router_exports_its_own_series_and_the_gateway_does_not(name: str) -> None:
    assert name in exported("router")
    assert name not in exported("gateway")


def test_the_gateway_keeps_its_own_series() -> None:
    got = exported("gateway")
    assert names.METRIC_GATEWAY_KV_EGRESS_BYTES in got
    assert names.METRIC_ROUTER_READY in got
