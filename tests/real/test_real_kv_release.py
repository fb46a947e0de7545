"""What the prefill side reused, and KV no decode will pull, on real vLLM 0.32 (NixlConnector over TCP).

* ``cached_tokens``: every engine runs with ``--enable-prompt-tokens-details`` (``engine_launch``), and a decode
  leg reports the prefill side's reuse (``kv_transfer_params.remote_prefill_cached_tokens``), so the router's
  answers carry it on both routes, whole and streamed: a repeated prompt reports whole 128-token blocks cached.
* Abandoned KV: a prefill's blocks are held under a lease (``kv_lease_duration``, 30 s) until a decode reads them.
  The release leg the router sends when a decode fails after its prefill (:func:`prfaas_router.path.call.release_body`,
  a decode leg every consumer rejects) makes the consumer tell the producer to free them at once: the blocks are
  freed, and the producer never logs their lease expiring.
"""

from __future__ import annotations

import json

import httpx

from conftest import Engines, Prompts, counters, delta
from prfaas_core import names
from prfaas_core.launch.vllm import PREFILL_KV_PARAMS
from prfaas_local.stack import LocalStack
from prfaas_local.vllm_engines import RealEngine, RealEnv
from prfaas_router.path.call import release_body
from prfaas_router.state.metrics import sample_sum
from prfaas_testbed.prom import wait_until

BLOCK = 128


def ask(url: str, env: RealEnv, prompt: str, stream: bool = False) -> tuple[httpx.Response, dict[str, object]]:
    body: dict[str, object] = {"model": env.served_model_name, "prompt": prompt, "max_tokens": 4, "temperature": 0}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    if not stream:
        return r, r.json()["usage"]
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    return r, events[-1]["usage"]


def test_answers_carry_what_the_prefill_side_reused(
    stack: LocalStack, engines: Engines, real_env: RealEnv, prompts: Prompts
) -> None:
    """A repeated prompt, whole and streamed, on each route: the answer's cached_tokens is exactly what the
    prefill engines' own counters say they reused (``local_cache_hit``), in whole blocks; on the remote route (one
    PrFaaS engine) that is the whole prompt but its last block. Which PD prefill instance takes a local repeat is
    the router's load-aware choice, so there the counters alone say what it should be."""
    router = stack.url("router")
    for tokens, route, producers in ((1500, "remote", ("prfaas",)), (400, "local", ("pdp0", "pdp1"))):
        prompt = prompts.text(tokens)
        first, use = ask(router, real_env, prompt)
        assert first.headers["x-prfaas-route"] == route
        assert use["prompt_tokens_details"]["cached_tokens"] == 0, use
        for stream in (False, True):
            before = counters(engines)
            again, use = ask(router, real_env, prompt, stream=stream)
            assert again.headers["x-prfaas-route"] == route
            cached = use["prompt_tokens_details"]["cached_tokens"]
            assert cached % BLOCK == 0 and cached < use["prompt_tokens"], use
            what = f"the {route} prefill engines' counters to show the {cached} cached tokens"
            wait_until(lambda b=before, c=cached, p=producers: reused(engines, b, p) == c, 30, what)
            if route == "remote":
                assert cached == (use["prompt_tokens"] - 1) // BLOCK * BLOCK > 0, use


def reused(engines: Engines, before: dict[str, dict[str, float]], producers: tuple[str, ...]) -> float:
    after = counters(engines)
    return sum(delta(before, after, n, "local_cache_hit") for n in producers)


def kv_usage(engine: RealEngine) -> float:
    value = sample_sum(engine.metrics_text(), names.VLLM_KV_CACHE_USAGE)
    assert value is not None
    return value


def test_an_abandoned_handle_is_freed_by_a_release_leg_not_by_its_lease(
    engines: Engines, real_env: RealEnv, prompts: Prompts
) -> None:
    producer, consumer = engines.prfaas, engines.pdd
    wait_until(lambda: kv_usage(producer) == 0.0, 60, "earlier leases on the PrFaaS engine to end")
    body = {"model": real_env.served_model_name, "prompt": prompts.text(1000), "max_tokens": 1, "stream": False}
    r = httpx.post(producer.url + "/v1/completions", json={**body, "kv_transfer_params": PREFILL_KV_PARAMS}, timeout=60)
    assert r.status_code == 200, r.text
    handle = r.json()["kv_transfer_params"]
    assert kv_usage(producer) > 0  # held for a decode that will never come
    rejected = httpx.post(consumer.url + "/v1/completions", json=release_body(handle), timeout=30)
    assert rejected.status_code == 404, rejected.text  # the consumer's model check rejects it ...
    # ... and its connector tells the producer to free the blocks (the bound only stops a hang: a lease that
    # freed them instead would log its expiry below)
    wait_until(lambda: kv_usage(producer) == 0.0, 60, "the producer to free the released blocks")
    expired = f"Releasing expired KV blocks for request {handle['remote_request_id']} "
    assert expired not in producer.log.read_text(errors="replace")
