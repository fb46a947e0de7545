"""Accounting no client can touch: the egress ledger keys on an id the router makes per request, so requests
sharing one client ``x-request-id`` are each counted and the link's cap holds; the client's id still reaches
the legs (tracing). The router runs in-process over a real emulated engine; the remote gateway is a held
aiohttp endpoint speaking the gateway's protocol, so that the remote legs stay in flight while the test reads
the ledger."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from aiohttp import web
from testbed_support import await_for, model_profile_json, serving

from prfaas_core.api import RouterConfig
from prfaas_engine import EngineConfig
from prfaas_engine import create_app as engine_app
from prfaas_router.edge.app import RUNTIME, create_app
from prfaas_router.state.config import compile_config

LINK = "ab"
PROMPT = "word " * 8000


def router_config(engine: str, gateway: str, capacity_gbps: float) -> RouterConfig:
    return RouterConfig.model_validate(
        {
            "pdCluster": "pd",
            "thresholdMinTokens": 1000,
            "model": model_profile_json(),
            "endpoints": [{"name": "pd-0", "url": engine, "role": "both"}],
            "remotes": [{"name": "prfaas", "url": gateway, "link": LINK}],
            "links": [{"name": LINK, "capacityGbps": capacity_gbps}],
            "routing": {"refreshIntervalSeconds": 60},
        }
    )


def test_colliding_client_ids_are_each_counted_and_the_cap_holds() -> None:
    async def go() -> None:
        release = asyncio.Event()
        seen_ids: list[str] = []

        async def held_prefill(request: web.Request) -> web.Response:
            seen_ids.append(request.headers.get("x-request-id", ""))
            await release.wait()
            return web.json_response({"error": "released"}, status=503)  # the router then prefills locally

        gw = web.Application()
        gw.router.add_post("/v1/completions", held_prefill)
        async with (
            serving(engine_app(EngineConfig(role="both", port=0))) as engine,
            serving(gw) as gateway,
        ):
            config = router_config(engine, gateway, capacity_gbps=1e6)
            app = create_app(config)
            rt = app[RUNTIME]
            async with serving(app) as router, httpx.AsyncClient(timeout=60) as client:

                def post() -> Any:
                    body = {"model": "m", "prompt": PROMPT, "max_tokens": 1}
                    return client.post(router + "/v1/completions", json=body, headers={"x-request-id": "same"})

                first = asyncio.ensure_future(post())
                await await_for(lambda: rt.ledger(LINK).in_flight == 1, 30, "the first remote leg")
                now = rt.model_now()
                one = rt.ledger(LINK).admission_gbps(now, rt.compiled.links[LINK])
                assert one > 0
                # now the cap fits 3.5 such streams: capacity x maxUtilization (0.8)
                rt.reconfigure(compile_config(config.model_copy(update={"links": [
                    config.links[0].model_copy(update={"capacity_gbps": 3.5 * one / 0.8})
                ]})))  # fmt: skip
                rest = [asyncio.ensure_future(post()) for _ in range(9)]
                # the ones over the cap are prefilled locally and answered while the remote legs are held
                await await_for(lambda: sum(t.done() for t in rest) >= 7, 60, "the requests over the cap")
                ledger = rt.ledger(LINK)
                assert ledger.in_flight == len(seen_ids) == 3  # one entry per request, not one per client id
                assert ledger.admission_gbps(rt.model_now(), rt.compiled.links[LINK]) <= 3.5 * one
                release.set()
                answers = await asyncio.gather(first, *rest)
        assert [a.status_code for a in answers] == [200] * 10, [a.text for a in answers]
        assert seen_ids == ["same"] * 3  # the client's id travels for tracing
        assert rt.ledger(LINK).in_flight == 0

    asyncio.run(go())
