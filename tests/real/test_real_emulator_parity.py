"""The engine emulator against the real thing: the same exchange on a real vLLM pair and on an emulated pair must
speak the same protocol — the KV handle's fields, the error bodies, the metric names the loop reads. Where they
disagree the emulator changes (the emulator is the fast copy, vLLM the reference)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conftest import Engines, Prompts
from prfaas_core import names
from prfaas_core.launch.vllm import PREFILL_KV_PARAMS, PROMPT_TOKENS_DETAILS_FLAG
from prfaas_local.ports import free_port
from prfaas_local.procs import spawn_process, stop_processes
from prfaas_local.vllm_engines import RealEnv
from prfaas_router.state.metrics import sample_sum

PRFAAS = [sys.executable, "-m", "prfaas_cli.main"]


@pytest.fixture
def emulated(tmp_path: Path, real_env: RealEnv) -> Iterator[dict[str, str]]:
    ports = {n: free_port() for n in ("p", "p_kv", "d", "d_kv")}
    procs = []
    for role, port, kv in (("prefill", ports["p"], ports["p_kv"]), ("decode", ports["d"], ports["d_kv"])):
        argv = [*PRFAAS, "engine", "--role", role, "--port", str(port), "--kv-listen", f"127.0.0.1:{kv}"]
        argv += ["--model", real_env.served_model_name, "--time-scale", "100", PROMPT_TOKENS_DETAILS_FLAG]
        procs.append(spawn_process(argv, tmp_path / f"{role}.log"))
    urls = {"prefill": f"http://127.0.0.1:{ports['p']}", "decode": f"http://127.0.0.1:{ports['d']}"}
    try:
        for url in urls.values():
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, f"the emulated engine at {url} did not start"
                time.sleep(0.1)
        yield urls
    finally:
        stop_processes(procs)


def _prefill(url: str, env: RealEnv, prompt: str) -> dict[str, object]:
    body = {"model": env.served_model_name, "prompt": prompt, "max_tokens": 1, "stream": False}
    r = httpx.post(url + "/v1/completions", json={**body, "kv_transfer_params": PREFILL_KV_PARAMS}, timeout=60)
    assert r.status_code == 200, r.text
    return dict(r.json()["kv_transfer_params"])


def test_kv_handle_error_bodies_and_metrics_match(
    emulated: dict[str, str], engines: Engines, real_env: RealEnv, prompts: Prompts
) -> None:
    prompt = prompts.text(300)
    real = _prefill(engines.pdp0.url, real_env, prompt)
    fake = _prefill(emulated["prefill"], real_env, prompt)
    assert set(real) == set(fake), f"real only: {set(real) - set(fake)}, emulator only: {set(fake) - set(real)}"
    assert real["transfer_mode"] == fake["transfer_mode"] == "pull"
    assert real["do_remote_prefill"] is fake["do_remote_prefill"] is True
    # the decode leg's usage: the same prompt_tokens_details, cached_tokens = what the prefill side reused
    used = {}
    for url, handle in ((engines.pdd.url, real), (emulated["decode"], fake)):
        body = {"model": real_env.served_model_name, "prompt": prompt, "max_tokens": 2, "kv_transfer_params": handle}
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        used[url] = details = r.json()["usage"]["prompt_tokens_details"]
        assert details["cached_tokens"] == handle["remote_prefill_cached_tokens"], (url, details, handle)
    assert set(used[engines.pdd.url]) == set(used[emulated["decode"]])

    bad = {"model": real_env.served_model_name, "prompt": prompt, "max_tokens": -1}
    for url in (engines.pdd.url, emulated["decode"]):
        r = httpx.post(url + "/v1/completions", json=bad, timeout=30)
        assert r.status_code == 400
        err = r.json()["error"]
        assert set(err) >= {"message", "type", "code"} and err["type"] == "BadRequestError" and err["code"] == 400
        assert "max_tokens" in err["message"]

    read_by_us = {
        names.VLLM_REQUESTS_RUNNING,
        names.VLLM_REQUESTS_WAITING,
        names.VLLM_KV_CACHE_USAGE,
        names.VLLM_PROMPT_TOKENS,
        names.VLLM_GENERATION_TOKENS,
        names.VLLM_PREFIX_CACHE_QUERIES,
        names.VLLM_PREFIX_CACHE_HITS,
        names.VLLM_PROMPT_TOKENS_BY_SOURCE,
    }
    for url in (engines.pdd.url, emulated["decode"]):
        text = httpx.get(url + "/metrics", timeout=10).text
        missing = {n for n in read_by_us if sample_sum(text, n) is None}
        assert not missing, f"{url} exports none of {missing}"
        for source in names.PROMPT_SOURCES:
            assert sample_sum(text, names.VLLM_PROMPT_TOKENS_BY_SOURCE, {"source": source}) is not None, source
