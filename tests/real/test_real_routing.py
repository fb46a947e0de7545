"""Our router and gateway on real vLLM engines with real KV transfer (NixlConnector over UCX TCP).

The oracle is vLLM's own ``vllm:prompt_tokens_by_source_total``: a request served through P/D shows its prompt
on the decode engine as ``external_kv_transfer`` (pulled over NIXL) and nowhere as ``local_compute``; the
engine that prefilled it shows it as ``local_compute``.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from conftest import THRESHOLD_TOKENS, Engines, Prompts, counters, delta
from prfaas_local.model_profile import check_profile, profile_from_model_dir
from prfaas_local.stack import LocalStack
from prfaas_local.vllm_engines import RealEngine, RealEnv

SHORT_TOKENS = 300
LONG_TOKENS = 1500


def complete(stack: LocalStack, env: RealEnv, prompt: str, max_tokens: int = 8) -> httpx.Response:
    body = {"model": env.served_model_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    r = httpx.post(stack.url("router") + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r


def test_short_request_prefills_locally_and_its_kv_crosses_to_decode(
    stack: LocalStack, engines: Engines, real_env: RealEnv, prompts: Prompts
) -> None:
    prompt = prompts.text(SHORT_TOKENS)
    before = counters(engines)
    r = complete(stack, real_env, prompt)
    after = counters(engines)
    n = r.json()["usage"]["prompt_tokens"]
    assert r.headers["x-prfaas-route"] == "local"
    # the router counted exactly what the engine counted (the model's own tokenizer, not the estimate)
    assert int(r.headers["x-prfaas-prompt-tokens"]) == n
    assert n < THRESHOLD_TOKENS
    assert delta(before, after, "pdd", "external_kv_transfer") == n
    assert delta(before, after, "pdd", "local_compute") == 0
    computed = {name: delta(before, after, name, "local_compute") for name in ("pdp0", "pdp1")}
    assert sorted(computed.values()) == [0, n], computed
    assert delta(before, after, "prfaas", "local_compute") == 0


def test_long_request_prefills_remotely_through_the_gateway(
    stack: LocalStack, engines: Engines, real_env: RealEnv, prompts: Prompts
) -> None:
    prompt = prompts.text(LONG_TOKENS)
    before = counters(engines)
    r = complete(stack, real_env, prompt)
    after = counters(engines)
    n = r.json()["usage"]["prompt_tokens"]
    assert r.headers["x-prfaas-route"] == "remote"
    assert int(r.headers["x-prfaas-prompt-tokens"]) == n > THRESHOLD_TOKENS
    assert delta(before, after, "prfaas", "local_compute") == n
    assert delta(before, after, "pdd", "external_kv_transfer") == n
    assert delta(before, after, "pdd", "local_compute") == 0
    assert delta(before, after, "pdp0", "local_compute") == delta(before, after, "pdp1", "local_compute") == 0


def _single(engine: RealEngine, env: RealEnv, prompt: str, max_tokens: int) -> str:
    """The answer of one engine alone (no P/D): the decode engine computing the prompt itself."""
    body = {"model": env.served_model_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    r = httpx.post(engine.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"])


def test_answers_through_pd_equal_a_single_instance_answer(
    stack: LocalStack, engines: Engines, real_env: RealEnv, prompts: Prompts
) -> None:
    for tokens, route in ((SHORT_TOKENS, "local"), (LONG_TOKENS, "remote")):
        prompt = prompts.text(tokens)
        r = complete(stack, real_env, prompt, max_tokens=24)
        assert r.headers["x-prfaas-route"] == route
        assert r.json()["choices"][0]["text"] == _single(engines.pdd, real_env, prompt, 24)


def test_gateway_requires_its_token(stack: LocalStack, real_env: RealEnv) -> None:
    body = {"model": real_env.served_model_name, "prompt": "hello", "max_tokens": 1}
    r = httpx.post(stack.url("gateway") + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 401
    r = httpx.post(
        stack.url("gateway") + "/v1/completions",
        json=body,
        headers={"Authorization": "Bearer wrong"},
        timeout=30,
    )
    assert r.status_code == 401


def test_the_dense_profile_predicts_the_transferred_bytes_at_held_back_lengths(
    engines: Engines, real_env: RealEnv, prompts: Prompts
) -> None:
    """``prfaas profile`` on the tiny dense model (from its config.json): its predictions against the decode engine's
    transferred bytes (``vllm:nixl_bytes_transferred``) at lengths that did not build it."""
    profile = profile_from_model_dir(Path(real_env.model), "tiny-llama", 128, real_env.served_model_name)
    texts = [prompts.text(n) for n in (129, 700, 1500)]
    checked = check_profile(profile, engines.pdp0.url, engines.pdd.url, texts, real_env.served_model_name)
    for c in checked:
        print(f"\n{c.prompt_tokens} tokens: predicted {c.predicted_bytes:.0f} B, transferred {c.measured_bytes:.0f} B")
    assert all(abs(c.error) <= 0.02 for c in checked), checked
