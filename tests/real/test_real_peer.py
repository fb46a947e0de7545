"""A peer check on the same real engines: vllm-router 0.1.17 in PD mode gives the same answers as our router (and
as a single instance), and its KV crosses by NIXL too."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conftest import Engines, Prompts, counters, delta
from prfaas_local.procs import stop_processes
from prfaas_local.stack import LocalStack
from prfaas_local.vllm_engines import RealEnv, start_vllm_router

BIN = Path(sys.executable).parent


@pytest.fixture
def vllm_router(engines: Engines, tmp_path: Path) -> Iterator[str]:
    url, proc = start_vllm_router(engines.pdp0.url, engines.pdd.url, tmp_path / "vllm-router.log")
    try:
        yield url
    finally:
        stop_processes([proc])


def _answer(url: str, env: RealEnv, prompt: str) -> httpx.Response:
    body = {"model": env.served_model_name, "prompt": prompt, "max_tokens": 20, "temperature": 0}
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r


def test_vllm_router_pd_mode_gives_the_same_answers(
    vllm_router: str, stack: LocalStack, engines: Engines, real_env: RealEnv, prompts: Prompts
) -> None:
    for tokens in (300, 1400):
        prompt = prompts.text(tokens)
        before = counters(engines)
        peer = _answer(vllm_router, real_env, prompt).json()
        after = counters(engines)
        n = peer["usage"]["prompt_tokens"]
        assert delta(before, after, "pdp0", "local_compute") == n  # the peer prefilled on its prefill engine
        assert delta(before, after, "pdd", "external_kv_transfer") == n  # and the decode pulled it all
        before = counters(engines)
        ours = _answer(stack.url("router"), real_env, prompt).json()
        after = counters(engines)
        assert ours["choices"][0]["text"] == peer["choices"][0]["text"]
        assert _counts(ours["usage"]) == _counts(peer["usage"])
        # cached_tokens differ by design: our router hands the decode the prefill side's reuse (a prefill engine
        # may still hold this prompt from the peer's turn), vllm-router does not, so its first answer says 0
        assert peer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        reused = sum(delta(before, after, e, "local_cache_hit") for e in ("prfaas", "pdp0", "pdp1"))
        assert ours["usage"]["prompt_tokens_details"]["cached_tokens"] == reused


def _counts(usage: dict[str, object]) -> dict[str, object]:
    """The usage without its details: the token counts both routers must agree on."""
    return {k: v for k, v in usage.items() if k != "prompt_tokens_details"}
