"""The router's fault findings (issue 15) over real sockets against the emulated engines: an invalid request costs
no engine work, a failed local prefill is retried once before the client sees an error, every local prefill
instance draining still serves through the remote, a short engine freeze takes nothing out."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
from collections.abc import Iterator

import httpx
import pytest
from testbed_support import TIME_SCALE, Stack, counter, http, processes, prompt, start_stack, wait_for

from prfaas_core.capacity.hardware import builtin_hardware


def engine_prompt_tokens(stack: Stack) -> float:
    """Prompt tokens every engine (PrFaaS, PD prefill, PD decode) has taken in: any engine work shows here."""
    return sum(counter(stack.url(n), "vllm:prompt_tokens_total") for n in ("prf", "pdp", "pdd"))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("router-faults")
    with processes(tmp) as procs:
        yield start_stack(procs, tmp)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"max_tokens": -1}, "'max_tokens' must lie in"),
        ({"max_tokens": "x"}, "'max_tokens' must be an integer"),
        ({"max_tokens": 0}, "'max_tokens' must lie in"),
        ({"max_tokens": 3.5}, "'max_tokens' must be an integer"),
        ({"temperature": -1}, "'temperature'"),
        ({"top_p": 0}, "'top_p'"),
        ({"stream_options": {"include_usage": True}}, "'stream_options' may be set only when 'stream' is true"),
        ({"min_tokens": 9, "max_tokens": 4}, "'min_tokens' (9) must not exceed"),
    ],
)
def test_an_invalid_long_request_is_rejected_before_any_engine_work(
    stack: Stack, extra: dict[str, object], needle: str
) -> None:
    """The finding: max_tokens -1 on a long prompt ran a whole remote prefill, then the decode rejected it and
    the KV stayed held. Now: 400 naming the field, and no engine sees the request."""
    before = engine_prompt_tokens(stack)
    body = {"model": "m", "prompt": prompt(40_000), "max_tokens": 4, **extra}
    status, answer = http("POST", stack.router + "/v1/completions", body, timeout_s=30)
    assert status == 400, answer
    assert needle in answer["error"]["message"]
    assert engine_prompt_tokens(stack) == before


def test_token_ids_beyond_any_vocabulary_are_a_400_naming_the_field(stack: Stack) -> None:
    before = engine_prompt_tokens(stack)
    status, answer = http("POST", stack.router + "/v1/completions", {"prompt": [1, 2, 1 << 32], "max_tokens": 2})
    assert status == 400 and "'prompt' token ids" in answer["error"]["message"]
    assert engine_prompt_tokens(stack) == before


def test_a_failing_local_prefill_is_retried_once_before_the_client_sees_an_error(stack: Stack) -> None:
    """The finding: a PD prefill engine answering 500 gave the client a 502. Now the leg is retried once
    (here the only other prefill path is the remote) and the client gets its answer."""
    pdp = stack.url("pdp")
    assert http("POST", pdp + "/admin/faults", {"error_rate": 1.0})[0] == 200
    try:
        before = counter(stack.router, "prfaas_router_prefill_retries_total", to="remote", outcome="ok")
        answers = [
            httpx.post(stack.router + "/v1/completions", json={"prompt": prompt(2_000), "max_tokens": 3}, timeout=30)
            for _ in range(4)
        ]
        assert [r.status_code for r in answers] == [200] * 4
        assert {r.headers["x-prfaas-route"] for r in answers} == {"retry"}
        after = counter(stack.router, "prfaas_router_prefill_retries_total", to="remote", outcome="ok")
        assert after == before + 4
        assert "prefill failed; retrying once" in (stack.dir / "router.log").read_text()
    finally:
        http("POST", pdp + "/admin/faults", {"error_rate": 0.0})


def test_every_local_prefill_draining_still_serves_through_the_remote(stack: Stack) -> None:
    """The misleading 503: 'no healthy decode instance' although the decode was fine. Now a short request goes
    to the remote while no local prefill instance can take it, and /ready stays ready (the remote can)."""
    stack.write_router_config(draining=["pd-0"])
    try:

        def drained() -> httpx.Response | None:
            r = httpx.post(stack.router + "/v1/completions", json={"prompt": prompt(500), "max_tokens": 2}, timeout=30)
            return r if r.headers.get("x-prfaas-route") == "remote" else None

        r = wait_for(drained, 15, "a short request to go remote while pd-0 drains")
        assert r.status_code == 200
        assert counter(stack.router, "prfaas_router_route_decisions_total", route="remote", reason="no-local-prefill")
        assert http("GET", stack.router + "/ready")[0] == 200
    finally:
        stack.write_router_config(draining=[])


def test_a_short_engine_freeze_marks_nothing_unhealthy(stack: Stack) -> None:
    """The finding: one slow /metrics read (> 2 s) marked an engine dead, and a 3 s freeze of the decode engine
    gave immediate 503s. Now it takes unhealthyAfterFailures (3) consecutive failed probes: a request sent
    while the frozen engine's probe has failed once waits for it and is answered."""
    pdd = next(p for name, p in stack.procs.procs if name == "pd-1")
    failures = counter(stack.router, "prfaas_router_health_probe_failures_total", engine="pd-1")
    os.kill(pdd.pid, signal.SIGSTOP)
    try:
        wait_for(
            lambda: counter(stack.router, "prfaas_router_health_probe_failures_total", engine="pd-1") > failures,
            15,
            "a failed probe of the frozen decode engine",
        )
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            body = {"prompt": prompt(500), "max_tokens": 2}
            pending = pool.submit(httpx.post, stack.router + "/v1/completions", json=body, timeout=30)
            os.kill(pdd.pid, signal.SIGCONT)
            assert pending.result().status_code == 200
    finally:
        os.kill(pdd.pid, signal.SIGCONT)
    assert counter(stack.router, "prfaas_router_engine_healthy", engine="pd-1") == 1


def test_a_burst_of_long_requests_gets_429_with_retry_after_instead_of_timing_out(stack: Stack) -> None:
    """The finding: 100 concurrent 32K-token requests all waited, 7 past the 30 s remote timeout, no
    backpressure. Now a request predicted to wait past the limit is turned away at once with Retry-After. Here
    the PrFaaS engine is slowed down so that a burst of remote prefills stays in flight; the limit lets about
    two of them wait."""
    one = builtin_hardware("H200").prefill_seconds(40_000.0) / TIME_SCALE  # type: ignore[union-attr]
    stack.write_router_config(limits={"maxPredictedTtftSeconds": 2.5 * one})
    assert http("POST", stack.url("prf") + "/admin/faults", {"slow_factor": 20.0})[0] == 200

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            body = {"prompt": prompt(40_000), "max_tokens": 2}
            return list(
                await asyncio.gather(*(client.post(stack.router + "/v1/completions", json=body) for _ in range(12)))
            )

    try:

        def rejected() -> list[httpx.Response] | None:
            answers = asyncio.run(burst())
            assert {r.status_code for r in answers} <= {200, 429}
            return answers if any(r.status_code == 429 for r in answers) else None

        answers = wait_for(rejected, 30, "the reloaded limit to turn part of a burst away")
    finally:
        http("POST", stack.url("prf") + "/admin/faults", {"slow_factor": 1.0})
        stack.write_router_config(limits={})
    turned = [r for r in answers if r.status_code == 429]
    assert any(r.status_code == 200 for r in answers)
    assert all(int(r.headers["Retry-After"]) >= 1 for r in turned)
    assert "predicted time to first token" in turned[0].json()["error"]["message"]


def test_a_remote_prefill_to_an_engine_that_freezes_is_cut_short_and_falls_back(stack: Stack) -> None:
    """The finding: a request already dispatched to a PrFaaS engine that froze (SIGSTOP) hung the full remote
    timeout before falling back. Now the leg is cut when the engine turns unhealthy (consecutive failed
    probes) and the request is prefilled locally: answered long before the 120 s remote timeout set here."""
    remotes = [{**stack.configs["router"]["remotes"][0], "timeoutSeconds": 120}]
    reloads = (stack.dir / "router.log").read_text().count("configuration reloaded")
    stack.write_router_config(remotes=remotes)
    prf = next(p for name, p in stack.procs.procs if name == "prfaas-0")
    try:
        wait_for(
            lambda: (stack.dir / "router.log").read_text().count("configuration reloaded") > reloads, 15, "the reload"
        )
        os.kill(prf.pid, signal.SIGSTOP)
        r = httpx.post(stack.router + "/v1/completions", json={"prompt": prompt(40_000), "max_tokens": 2}, timeout=60)
    finally:
        os.kill(prf.pid, signal.SIGCONT)
        stack.write_router_config(remotes=[{**remotes[0], "timeoutSeconds": 10}])
    assert r.status_code == 200 and r.headers["x-prfaas-route"] == "fallback"
    logs = (stack.dir / "router.log").read_text() + (stack.dir / "gateway.log").read_text()
    assert "legs in flight cut short" in logs


def test_a_decode_failing_after_the_prefill_releases_the_abandoned_kv(stack: Stack) -> None:
    """The decode leg fails after a prefill produced a KV handle: the client gets a clean 502, the handle is
    counted, and the router has a decode instance release it (a rejected leg carrying the handle, vLLM 0.32's
    notification-only read): the prefill engine holds nothing long before its KV timeout (480 s here)."""
    pdd, pdp = stack.url("pdd"), stack.url("pdp")
    before = counter(stack.router, "prfaas_router_abandoned_kv_handles_total", cluster="pd")
    released = counter(stack.router, "prfaas_router_released_kv_handles_total", cluster="pd")
    assert http("POST", pdd + "/admin/faults", {"error_rate": 1.0})[0] == 200
    try:
        status, answer = http(
            "POST", stack.router + "/v1/completions", {"prompt": prompt(500), "max_tokens": 2}, timeout_s=30
        )
    finally:
        http("POST", pdd + "/admin/faults", {"error_rate": 0.0})
    assert status == 502 and "decode on pd-1 answered 500" in answer["error"]["message"]
    assert counter(stack.router, "prfaas_router_abandoned_kv_handles_total", cluster="pd") == before + 1
    wait_for(
        lambda: counter(stack.router, "prfaas_router_released_kv_handles_total", cluster="pd") == released + 1,
        15,
        "the router to release the abandoned KV",
    )
    wait_for(lambda: http("GET", pdp + "/admin/state")[1]["kv_handles"] == 0, 15, "the prefill engine to free it")
    assert "its KV released" in (stack.dir / "router.log").read_text()


def test_every_local_prefill_failing_falls_back_to_the_remote(stack: Stack) -> None:
    """Issue 39 item 7: with two PD prefill instances both answering 500, the one retry went to the other local
    instance and the client got a 502 although the remote was healthy (18 of 20). Now, once the retry failed
    too, the remote takes the request. The second instance is a second name for the same (failing) engine."""
    endpoints = stack.configs["router"]["endpoints"]
    pd0 = next(e for e in endpoints if e["name"] == "pd-0")
    stack.write_router_config(endpoints=[*endpoints, {**pd0, "name": "pd-0b"}])
    pdp = stack.url("pdp")

    def remote_serves() -> bool:  # an earlier case froze the PrFaaS engine: its breaker may still be open
        r = httpx.post(stack.router + "/v1/completions", json={"prompt": prompt(40_000), "max_tokens": 2}, timeout=60)
        return r.status_code == 200 and r.headers["x-prfaas-route"] == "remote"

    try:
        wait_for(
            lambda: counter(stack.router, "prfaas_router_engine_healthy", engine="pd-0b") == 1 or None,
            15,
            "the router to probe pd-0b healthy",
        )
        wait_for(remote_serves, 60, "a long request to be prefilled remotely again", 0.5)
        assert http("POST", pdp + "/admin/faults", {"error_rate": 1.0})[0] == 200
        before = counter(stack.router, "prfaas_router_prefill_retries_total", to="remote", outcome="ok")
        local_errors = counter(stack.router, "prfaas_router_prefill_retries_total", to="local", outcome="error")
        answers = [
            httpx.post(stack.router + "/v1/completions", json={"prompt": prompt(2_000), "max_tokens": 3}, timeout=30)
            for _ in range(4)
        ]
        assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]
        assert {r.headers["x-prfaas-route"] for r in answers} == {"retry"}
        assert counter(stack.router, "prfaas_router_prefill_retries_total", to="local", outcome="error") > local_errors
        after = counter(stack.router, "prfaas_router_prefill_retries_total", to="remote", outcome="ok")
        assert after == before + 4
        assert (
            "prefill failed on every local instance tried; the remote takes it"
            in (stack.dir / "router.log").read_text()
        )
    finally:
        http("POST", pdp + "/admin/faults", {"error_rate": 0.0})
        stack.write_router_config(endpoints=endpoints)


def test_a_request_past_the_models_context_is_a_400_before_any_leg_and_a_huge_body_a_413(stack: Stack) -> None:
    """Issue 39 item 9: a 35K-token prompt with max_tokens 250,000 ran a whole remote prefill, then the decode
    refused it; a 7-MB text prompt got a retryable 429. Now the router knows the engines' max_model_len (their
    /v1/models) and answers 400 before any leg; a body over maxBodyBytes is a 413."""

    def router_says_context() -> str | None:
        body = {"prompt": prompt(100), "max_tokens": 262_100}
        status, answer = http("POST", stack.router + "/v1/completions", body, timeout_s=30)
        message = answer.get("error", {}).get("message", "") if isinstance(answer, dict) else ""
        return message if status == 400 and "its engines' max_model_len" in message else None

    wait_for(router_says_context, 15, "the router to learn the engines' max_model_len")
    before = engine_prompt_tokens(stack)
    body = {"prompt": prompt(35_000), "max_tokens": 250_000}
    status, answer = http("POST", stack.router + "/v1/completions", body, timeout_s=30)
    assert status == 400, answer
    assert "maximum context length is 262144 tokens" in answer["error"]["message"]
    assert "'max_tokens'" in answer["error"]["message"]
    seven_mb = {"prompt": "x" * (7 << 20), "max_tokens": 2}
    r = httpx.post(stack.router + "/v1/completions", json=seven_mb, timeout=60)
    assert r.status_code == 400 and "maximum context length" in r.text, r.text[:300]
    assert engine_prompt_tokens(stack) == before  # no engine saw any of them
    too_big = httpx.post(stack.router + "/v1/completions", json={"prompt": "x" * (9 << 20)}, timeout=60)
    assert too_big.status_code == 413, too_big.text[:300]


def test_tenants_learn_nothing_of_each_others_cache_and_clients_get_no_server_timing(stack: Stack) -> None:
    """Issue 39 item 8: a guess sharing a victim's first tokens came back with cached_tokens of the shared prefix
    (and a faster prefill), across clients. With security.tenantHeader the router salts each tenant's prompts
    (vLLM's cache_salt; the router's prefix indexes too): another tenant's guess finds nothing cached, the same
    tenant's next turn still does. Server-Timing is off toward clients by default."""
    reloads = (stack.dir / "router.log").read_text().count("configuration reloaded")
    stack.write_router_config(security={"tenantHeader": "x-tenant"})
    try:
        wait_for(
            lambda: (stack.dir / "router.log").read_text().count("configuration reloaded") > reloads or None,
            15,
            "the reload",
        )

        def cached(text: str, tenant: str) -> int:
            r = httpx.post(
                stack.router + "/v1/completions",
                json={"prompt": text, "max_tokens": 2},
                headers={"x-tenant": tenant},
                timeout=30,
            )
            assert r.status_code == 200, r.text
            assert "server-timing" not in r.headers  # off by default toward clients
            return int((r.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0)

        victim = prompt(3_000)
        assert cached(victim, "victim") == 0
        guess = victim[: 2_000 * 4] + "y" * (1_000 * 4)
        assert cached(guess, "attacker") == 0  # before: the shared 2,000 tokens came back cached
        assert cached(guess + "z" * 400, "victim") >= 1_900  # the victim's own next turn still hits its prefix
    finally:
        stack.write_router_config(security={})
