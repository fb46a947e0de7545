"""A client's W3C trace context reaches real vLLM engines through our router and gateway, on every leg: each engine
that served a leg exports its own span (vLLM's ``--otlp-traces-endpoint``) into the client's trace."""

from __future__ import annotations

import os
import time

import httpx

from conftest import Engines, Prompts
from prfaas_local.stack import LocalStack
from prfaas_local.vllm_engines import RealEnv
from support.otlp import OtlpReceiver


def test_a_clients_trace_reaches_vllm_on_every_leg(
    stack: LocalStack, engines: Engines, otlp: OtlpReceiver, real_env: RealEnv, prompts: Prompts
) -> None:
    for tokens, route in ((200, "local"), (1400, "remote")):  # below and above the tier's threshold
        trace_id = os.urandom(16).hex()
        body = {"model": real_env.served_model_name, "prompt": prompts.text(tokens), "max_tokens": 4}
        headers = {"traceparent": f"00-{trace_id}-{os.urandom(8).hex()}-01", "x-request-id": f"trace-{route}"}
        answer = httpx.post(stack.url("router") + "/v1/completions", json=body, headers=headers, timeout=120)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-prfaas-route"] == route
        prefill = {"prfaas"} if route == "remote" else {engines.pdp0.name, engines.pdp1.name}
        deadline = time.monotonic() + 30  # the engines export every 100 ms
        while not ((got := otlp.engines_with(trace_id)) >= {"pdd"} and got & prefill):
            assert time.monotonic() < deadline, f"{route}: spans of the client's trace came from {got} only"
            time.sleep(0.1)
        assert got <= {"pdd"} | prefill, got  # no other engine served a leg of it
