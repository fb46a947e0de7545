"""The only decode engine killed on the local stack of ``prfaas up`` (LocalStack) with its long-term loop
(LocalLoop over the core's step): the router reports not ready with the reason, every request is answered
(clean 503s while nothing can decode), and the loop's emergency verdict flips a prefill instance to decode at
once, after which requests are served again."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest
from ledger import Ledger, record
from testbed_support import wait_for

from prfaas_core.capacity.plan_inputs import case_study_inputs
from prfaas_local.local_loop import LocalCluster, LocalLoop
from prfaas_local.scenario import DEFAULT_SCENARIO, load_scenario
from prfaas_local.stack import LocalStack, StackSpec
from prfaas_local.up import role_params

pytestmark = pytest.mark.chaos


def test_decode_killed_the_loop_flips_a_prefill_instance_and_service_returns(tmp_path: Path) -> None:
    previous = signal.getsignal(signal.SIGTERM)
    stack = LocalStack(StackSpec(n_prfaas=1, n_pd=3, initial_prefill=2, time_scale=8.0), tmp_path)
    cluster: LocalCluster | None = None
    try:
        stack.start()
        assert stack.router_config is not None
        router = stack.urls["router"]
        cluster = LocalCluster(
            stack.config_path,
            stack.router_config,
            stack.urls["gateway"] + "/status",
            gateway_headers=stack.gateway_headers,
            router_url=router,
            time_scale=8.0,
        )
        loop = LocalLoop(cluster, role_params(load_scenario(DEFAULT_SCENARIO).loop), case_study_inputs())
        decode = next(e for e in cluster.config.endpoints if e.role == "decode")
        ledger = Ledger(router)
        httpx.post(decode.url + "/admin/faults", json={"die": True}, timeout=5)
        killed = time.monotonic()
        with ledger.traffic("decode killed (prfaas up)"):

            def not_ready() -> str | None:
                r = httpx.get(router + "/ready", timeout=5)
                return r.json()["error"]["message"] if r.status_code == 503 else None

            why = wait_for(not_ready, 30, "the router to say it cannot serve")
            # a not-ready router still says which config it runs: the emergency flip's drain is published and
            # seen at once (it waited the whole publish timeout, ~60 s, while /ready had no digest)
            assert cluster.applied()
            now, flipped = 0.0, None
            while flipped is None:  # the loop's cycles, on its own clock (drain polls)
                d = loop.run_once(now)
                if d.roles is not None and d.roles.action == "FlipToDecode":
                    flipped = d
                now = loop.next_due_s()
                assert now < 600, "no flip within the drain timeout"
            wait_for(lambda: httpx.get(router + "/ready", timeout=5).status_code == 200, 60, "ready again")
            wait_for(
                lambda: any(e.status == 200 and e.sent_s > killed for e in ledger.of("decode killed (prfaas up)")),
                60,
                "a request answered after the flip",
            )
        served = [e for e in ledger.of("decode killed (prfaas up)") if e.status == 200 and e.sent_s > killed]
        recovered = min(e.sent_s + e.seconds for e in served) - killed
    finally:
        if cluster is not None:
            cluster.close()
        stack.stop()
        signal.signal(signal.SIGTERM, previous)
    assert "no healthy, non-draining decode instance" in why
    assert flipped.reason.startswith("emergency: no healthy decode instance")
    ledger.assert_all_answered("decode killed (prfaas up)")
    summary = ledger.summary("decode killed (prfaas up)")
    record(
        "decode killed (prfaas up, loop)",
        answered=summary,
        recovered_s=round(recovered, 2),
        reason=flipped.reason[:120],
        metric="prfaas_router_ready; the loop's FlipToDecode decision",
        log="router not ready / router ready again; decision reason 'emergency: no healthy decode instance'",
    )
