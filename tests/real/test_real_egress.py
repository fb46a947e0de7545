"""The real egress signal on real engines: a long request prefilled remotely moves the router's
``prfaas_router_remote_kv_bytes_total{link}`` and the gateway's ``prfaas_gateway_kv_egress_bytes_total{link}`` by
``S_kv`` of the whole KV blocks (``prefixBlockTokens`` = the engines' block size, 128) that hold the prompt tokens
the engine reported (512 B/token for the tiny model: ModelProfile), the gateway's status endpoint reports the same,
and vLLM's own NIXL histogram on the decode engine moves by exactly as much (what actually crossed)."""

from __future__ import annotations

import math

import httpx

from conftest import THRESHOLD_TOKENS, Engines, Prompts
from prfaas_core import names
from prfaas_core.api import ModelProfileSpec, SloSpec
from prfaas_core.capacity.kv import kv_model_from_profile
from prfaas_core.request.slo import ttft_objective_s
from prfaas_local.stack import LINK, LocalStack
from prfaas_local.stack_configs import VLLM_TOKEN as TOKEN
from prfaas_local.stack_configs import tiny_model_profile
from prfaas_local.vllm_engines import BLOCK_SIZE, RealEnv, example_slo
from prfaas_router.state.metrics import sample_sum

LONG_TOKENS = 1200


AUTH = {"Authorization": f"Bearer {TOKEN}"}  # the gateway's /metrics and /status need its token


def _counter(url: str, name: str, labels: dict[str, str] | None = None) -> float:
    return sample_sum(httpx.get(url + "/metrics", headers=AUTH, timeout=10).text, name, labels or {}) or 0.0


def _status_egress(stack: LocalStack) -> float:
    body = httpx.get(stack.url("gateway") + "/status", headers=AUTH, timeout=10).json()
    return float(body["kvEgressBytes"].get(LINK, 0.0))


def test_egress_counters_move_by_the_kv_of_the_reported_prompt(
    stack: LocalStack, engines: Engines, real_env: RealEnv, prompts: Prompts
) -> None:
    router, gateway = stack.url("router"), stack.url("gateway")
    nixl = names.VLLM_NIXL_BYTES_TRANSFERRED + "_sum"
    router_text = httpx.get(router + "/metrics", timeout=10).text
    ttft_before = sample_sum(router_text, names.METRIC_ROUTER_TTFT_SECONDS + "_sum", {"route": "remote"}) or 0.0
    slo_before = {
        res: sample_sum(router_text, names.METRIC_ROUTER_TTFT_SLO, {"route": "remote", "result": res}) or 0.0
        for res in names.TTFT_SLO_RESULTS
    }
    before = (
        _counter(router, names.METRIC_ROUTER_REMOTE_BYTES, {"link": LINK}),
        _counter(gateway, names.METRIC_GATEWAY_KV_EGRESS_BYTES, {"link": LINK}),
        _status_egress(stack),
        sample_sum(engines.pdd.metrics_text(), nixl, {}) or 0.0,
    )
    body = {"model": real_env.served_model_name, "prompt": prompts.text(LONG_TOKENS), "max_tokens": 4}
    r = httpx.post(router + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.headers["x-prfaas-route"] == "remote"
    n = r.json()["usage"]["prompt_tokens"]
    assert n > THRESHOLD_TOKENS
    kv = kv_model_from_profile(ModelProfileSpec.model_validate(tiny_model_profile(real_env)))
    s_kv = kv.with_blocks(BLOCK_SIZE).block_kv_bytes(n)
    assert s_kv == 512 * math.ceil(n / BLOCK_SIZE) * BLOCK_SIZE
    after = (
        _counter(router, names.METRIC_ROUTER_REMOTE_BYTES, {"link": LINK}),
        _counter(gateway, names.METRIC_GATEWAY_KV_EGRESS_BYTES, {"link": LINK}),
        _status_egress(stack),
        sample_sum(engines.pdd.metrics_text(), nixl, {}) or 0.0,
    )
    moved = [a - b for a, b in zip(after, before, strict=True)]
    assert moved[0] == s_kv  # the router: what it admitted over the link
    assert moved[1] == s_kv  # the gateway: what it served, labelled with the router's link
    assert moved[2] == s_kv  # and its status endpoint, which region B reads, says the same
    # vLLM's own count of what crossed: the same whole blocks (a fresh prompt: the decode pulls every block)
    assert moved[3] == s_kv
    # the router judged the request against its own TTFT objective (the example PDCluster's slo for n tokens)
    router_text = httpx.get(router + "/metrics", timeout=10).text
    ttft = (
        sample_sum(router_text, names.METRIC_ROUTER_TTFT_SECONDS + "_sum", {"route": "remote"}) or 0.0
    ) - ttft_before
    slo_moved = {
        res: (sample_sum(router_text, names.METRIC_ROUTER_TTFT_SLO, {"route": "remote", "result": res}) or 0.0)
        - slo_before[res]
        for res in names.TTFT_SLO_RESULTS
    }
    objective = ttft_objective_s(SloSpec.model_validate(example_slo()), n)
    assert slo_moved == ({"met": 1.0, "missed": 0.0} if ttft <= objective else {"met": 0.0, "missed": 1.0})
