"""The router over real sockets, against real engine and link emulator processes: both routes, the vLLM
PD exchange, streaming with the openai SDK, bad input, the gateway's auth, every failure path (no request
lost), client disconnects, backpressure and hot reload."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from testbed_support import (
    BYTE_SCALE,
    PRFAAS,
    Stack,
    counter,
    free_port,
    http,
    metric_value,
    processes,
    prompt,
    start_stack,
    wait_for,
)

from prfaas_core.capacity.kv import kv_model_from_profile
from prfaas_core.capacity.profiles import builtin_model_profiles

KV = kv_model_from_profile(builtin_model_profiles()["internal-1t"])


def complete(stack: Stack, text: str, max_tokens: int = 4, **extra: object) -> tuple[int, object]:
    return http(
        "POST",
        stack.router + "/v1/completions",
        {"model": "m", "prompt": text, "max_tokens": max_tokens, **extra},
        timeout_s=30,
    )


def metrics(url: str) -> str:
    return httpx.get(url + "/metrics", timeout=5).text


@pytest.fixture(scope="module")
def waiting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A router started with ``--wait-for-config`` over a file nobody has written yet (as the chart starts one
    before the operator writes its ConfigMap): the file's path and the router's URL. Started before the stack,
    so that its start overlaps the stack's."""
    tmp = tmp_path_factory.mktemp("waiting")
    path, port = tmp / "router.json", free_port()
    with processes(tmp) as procs:
        procs.start(
            "waiting-router", [*PRFAAS, "router", "--wait-for-config", "--config", str(path), "--port", str(port)]
        )
        yield path, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, waiting: tuple[Path, str]) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("router")
    with processes(tmp) as procs:
        yield start_stack(procs, tmp)


def test_short_prompt_is_prefilled_locally(stack: Stack) -> None:
    before = counter(stack.router, "prfaas_router_route_decisions_total", route="local", reason="threshold")
    status, body = complete(stack, prompt(2_000))
    assert status == 200, body
    assert body["choices"][0]["text"] and body["usage"]["prompt_tokens"] == 2_000
    after = counter(stack.router, "prfaas_router_route_decisions_total", route="local", reason="threshold")
    assert after == before + 1


def test_long_prompt_is_prefilled_remotely_and_its_kv_crosses_the_link(stack: Stack) -> None:
    link = stack.url("link_admin")
    bytes_before = counter(link, "prfaas_link_egress_bytes_total", link="a-to-b")
    remote_before = counter(stack.router, "prfaas_router_requests_total", route="remote", outcome="ok")
    status, body = complete(stack, prompt(40_000))
    assert status == 200, body
    assert counter(stack.router, "prfaas_router_requests_total", route="remote", outcome="ok") == remote_before + 1
    moved = counter(link, "prfaas_link_egress_bytes_total", link="a-to-b") - bytes_before
    # the link counts model bytes; what crossed is S_kv of the whole prompt (nothing cached in region B)
    assert moved == pytest.approx(KV.kv_bytes(40_000), rel=0.02, abs=2 / BYTE_SCALE)


def test_repeated_prompt_goes_where_its_prefix_is(stack: Stack) -> None:
    """Prefix truth: a follow-up turn of a remotely prefilled session goes remote again, where its prefix is (the
    decode instance's copy of it saves the PD prefill instances nothing); one of a locally prefilled session stays
    local on its PD prefix. The router's prefix-hit counters say which cluster held it, and the answers' usage says
    what the prefill side reused (``cached_tokens``: the finding was always 0)."""
    text = prompt(30_000)
    assert complete(stack, text)[0] == 200  # > t: remote
    hits = counter(stack.router, "prfaas_router_prefix_hit_tokens_total", cluster="prfaas")
    status, _ = http(
        "POST", stack.router + "/v1/completions", {"prompt": text + " and one more", "max_tokens": 2}, timeout_s=30
    )
    follow = httpx.post(
        stack.router + "/v1/completions", json={"prompt": text + " and another one", "max_tokens": 2}, timeout=30
    )
    assert status == 200 and follow.status_code == 200 and follow.headers["x-prfaas-route"] == "remote"
    assert follow.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 29_000  # the PrFaaS side's prefix
    assert counter(stack.router, "prfaas_router_prefix_hit_tokens_total", cluster="prfaas") >= hits + 2 * 29_000
    short = prompt(10_000)  # <= t: local
    assert complete(stack, short)[0] == 200
    pd_hits = counter(stack.router, "prfaas_router_prefix_hit_tokens_total", cluster="pd")
    again = httpx.post(stack.router + "/v1/completions", json={"prompt": short + " more", "max_tokens": 2}, timeout=30)
    assert again.status_code == 200 and again.headers["x-prfaas-route"] == "local"
    assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 9_900  # the PD prefill's prefix
    assert counter(stack.router, "prfaas_router_prefix_hit_tokens_total", cluster="pd") >= pd_hits + 9_900


def test_ttft_and_tpot_are_recorded_by_route_streamed_or_not(stack: Stack) -> None:
    def count(name: str, route: str) -> float:
        return counter(stack.router, f"{name}_count", route=route)

    ttft_before, e2e_before = count("prfaas_router_ttft_seconds", "local"), count("prfaas_router_e2e_seconds", "local")
    status, body = complete(stack, prompt(1_000))
    assert status == 200, body  # not streamed: TTFT is the end of its prefill leg
    assert count("prfaas_router_ttft_seconds", "local") == ttft_before + 1
    assert count("prfaas_router_e2e_seconds", "local") == e2e_before + 1
    tpot_before = count("prfaas_router_tpot_seconds", "local")
    tpot_sum_before = counter(stack.router, "prfaas_router_tpot_seconds_sum", route="local")
    client = openai.OpenAI(base_url=stack.router + "/v1", api_key="unused", timeout=30)
    stream = client.completions.create(model="m", prompt=prompt(800), max_tokens=6, stream=True)
    assert len([c for c in stream if c.choices]) >= 5
    client.close()
    # the router observes TPOT when its stream ends, which may be just after the client read [DONE]
    wait_for(lambda: count("prfaas_router_tpot_seconds", "local") == tpot_before + 1, 10, "the TPOT observation")
    # at this test's 200x clock the chunks may arrive together: the observed TPOT is tiny, never negative
    assert counter(stack.router, "prfaas_router_tpot_seconds_sum", route="local") >= tpot_sum_before


def test_openai_sdk_streams_chat_with_usage_through_the_router(stack: Stack) -> None:
    client = openai.OpenAI(base_url=stack.router + "/v1", api_key="unused", timeout=30)
    for size in (500, 30_000):  # one local, one remote; each asked twice (the second finds its prefix cached)
        content = prompt(size)
        cached = []
        for _ in range(2):
            chunks = list(
                client.chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": content}],
                    max_tokens=5,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            )
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert len(text.split()) == 5
            usage = chunks[-1].usage
            assert usage is not None and usage.completion_tokens == 5 and usage.prompt_tokens_details is not None
            cached.append(usage.prompt_tokens_details.cached_tokens)
        assert cached[0] == 0 and cached[1] is not None and cached[1] >= size - 16, (size, cached)
    client.close()


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (json.dumps({"model": "m"}).encode(), 400, "'prompt'"),
        (json.dumps({"model": "m", "prompt": "hi", "stream": "yes"}).encode(), 400, "'stream'"),
    ],
)
def test_malformed_requests_get_a_4xx_naming_the_problem(stack: Stack, body: bytes, status: int, needle: str) -> None:
    resp = httpx.post(stack.router + "/v1/completions", content=body, timeout=10)
    assert resp.status_code == status and needle in resp.text


def test_oversized_body_is_413(stack: Stack) -> None:
    big = {"model": "m", "prompt": "x" * (9 << 20)}
    resp = httpx.post(stack.router + "/v1/completions", json=big, timeout=30)
    assert resp.status_code == 413


def test_gateway_requires_its_token_and_serves_prefill_legs_only(stack: Stack) -> None:
    gw = stack.url("gateway")
    body = {"model": "m", "prompt": "hello", "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
    assert httpx.post(gw + "/v1/completions", json=body, timeout=10).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert httpx.post(gw + "/v1/completions", json=body, headers=wrong, timeout=10).status_code == 401
    auth = {"Authorization": "Bearer s3cret-token"}
    plain = {"model": "m", "prompt": "hello", "max_tokens": 1}
    resp = httpx.post(gw + "/v1/completions", json=plain, headers=auth, timeout=10)
    assert resp.status_code == 400 and "prefill legs only" in resp.text
    resp = httpx.post(gw + "/v1/completions", json=body, headers=auth, timeout=10)
    assert resp.status_code == 200 and resp.json()["kv_transfer_params"]["do_remote_prefill"] is True
    assert "s3cret" not in (stack.dir / "gateway.log").read_text() + (stack.dir / "router.log").read_text()


async def hang_up_mid_stream(stack: Stack) -> None:
    """A long streamed request whose client reads the first chunk, then hangs up."""
    async with httpx.AsyncClient(timeout=30) as client:
        body = {"model": "m", "prompt": prompt(1_000), "max_tokens": 20_000, "stream": True}
        async with client.stream("POST", stack.router + "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            async for _ in resp.aiter_bytes():
                break  # first chunk, then hang up


def test_client_disconnect_cancels_both_legs(stack: Stack) -> None:
    asyncio.run(hang_up_mid_stream(stack))

    def decode_idle() -> bool:
        return metric_value(metrics(stack.url("pdd")), "vllm:num_requests_running") == 0

    wait_for(decode_idle, 30, "the decode engine to drop the abandoned stream")
    assert counter(stack.router, "prfaas_router_requests_total", route="local", outcome="cancelled") >= 1


def test_remote_5xx_falls_back_to_local_prefill(stack: Stack) -> None:
    prf = stack.url("prf")
    assert http("POST", prf + "/admin/faults", {"error_rate": 1.0})[0] == 200
    try:
        before = counter(stack.router, "prfaas_router_fallbacks_total")
        statuses = [complete(stack, prompt(40_000))[0] for _ in range(3)]
        assert statuses == [200, 200, 200]
        assert counter(stack.router, "prfaas_router_fallbacks_total") >= before + 1
    finally:
        http("POST", prf + "/admin/faults", {"error_rate": 0.0})


def test_decode_dying_mid_stream_ends_that_stream_with_an_error(stack: Stack) -> None:
    pdd = stack.url("pdd")
    assert http("POST", pdd + "/admin/faults", {"drop_mid_stream": 1.0})[0] == 200
    try:
        body = {"model": "m", "prompt": prompt(500), "max_tokens": 50, "stream": True}
        with httpx.stream("POST", stack.router + "/v1/completions", json=body, timeout=15) as resp:
            text = resp.read().decode()
        assert resp.status_code == 200
        assert '"error"' in text and "broke" in text
    finally:
        http("POST", pdd + "/admin/faults", {"drop_mid_stream": 0.0})
    assert complete(stack, prompt(500))[0] == 200  # others unaffected


def test_each_request_outcome_is_counted_exactly_once(stack: Stack) -> None:
    """The request path's per-request object counts a request's outcome once, whichever way it ends: success,
    a remote failure that falls back, a client that hangs up mid-stream, a decode that dies mid-stream."""

    def counts() -> tuple[float, dict[str, float]]:
        text = metrics(stack.router)
        total = metric_value(text, "prfaas_router_requests_total")
        outcomes = ("ok", "error", "cancelled")
        return total, {o: metric_value(text, "prfaas_router_requests_total", {"outcome": o}) for o in outcomes}

    def once(outcome: str, run: object) -> None:
        total, by = counts()
        run()  # type: ignore[operator]
        # a cancel is counted as the router notices the hang-up: wait for it, then check that nothing else came
        wait_for(lambda: counts()[0] > total, 30, f"the {outcome} request to be counted")
        after, by_after = counts()
        assert after == total + 1, (outcome, by, by_after)
        assert by_after[outcome] == by[outcome] + 1, (outcome, by, by_after)

    once("ok", lambda: complete(stack, prompt(2_000)))

    prf = stack.url("prf")
    assert http("POST", prf + "/admin/faults", {"error_rate": 1.0})[0] == 200
    try:
        fallbacks = counter(stack.router, "prfaas_router_fallbacks_total")
        once("ok", lambda: complete(stack, prompt(40_000)))
        assert counter(stack.router, "prfaas_router_fallbacks_total") == fallbacks + 1
    finally:
        http("POST", prf + "/admin/faults", {"error_rate": 0.0})

    once("cancelled", lambda: asyncio.run(hang_up_mid_stream(stack)))

    pdd = stack.url("pdd")
    assert http("POST", pdd + "/admin/faults", {"drop_mid_stream": 1.0})[0] == 200
    try:
        body = {"model": "m", "prompt": prompt(500), "max_tokens": 50, "stream": True}

        def broken_stream() -> None:
            with httpx.stream("POST", stack.router + "/v1/completions", json=body, timeout=15) as resp:
                assert resp.status_code == 200 and "broke" in resp.read().decode()

        once("error", broken_stream)
    finally:
        http("POST", pdd + "/admin/faults", {"drop_mid_stream": 0.0})


def test_hot_reload_applies_limits_and_backpressure_answers_429(stack: Stack) -> None:
    stack.write_router_config(limits={"maxInFlight": 1, "retryAfterSeconds": 3})
    pdd = stack.url("pdd")
    http("POST", pdd + "/admin/faults", {"slow_factor": 50.0})

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            body = {"model": "m", "prompt": prompt(100), "max_tokens": 20}
            return list(
                await asyncio.gather(*(client.post(stack.router + "/v1/completions", json=body) for _ in range(4)))
            )

    try:

        def reloaded() -> bool:
            return any(r.status_code == 429 for r in asyncio.run(burst()))

        wait_for(reloaded, 15, "the reloaded limit to answer 429")
        rejected = [r for r in asyncio.run(burst()) if r.status_code == 429]
        assert rejected and rejected[0].headers["Retry-After"] == "3"
    finally:
        http("POST", pdd + "/admin/faults", {"slow_factor": 1.0})
        stack.write_router_config(limits={})


def ready(url: str) -> dict[str, object]:
    answer: dict[str, object] = httpx.get(url + "/ready", timeout=5).json()
    return answer


def test_invalid_config_file_keeps_the_previous_config(stack: Stack) -> None:
    """A file rewritten invalid is reported and the previous configuration serves on: /ready stays ready, its
    config_digest still the one in force, its config_error saying why the new file is not."""
    in_force = ready(stack.router)["config_digest"]
    good = (stack.dir / "router.json").read_text()
    (stack.dir / "router.json").write_text('{"pdCluster": "pd", "thresholdMinTokens": -5}')
    try:
        wait_for(lambda: "invalid RouterConfig" in (stack.dir / "router.log").read_text(), 10, "the reload error")
        answer = wait_for(lambda: (a := ready(stack.router)).get("config_error") and a, 10, "/ready's config_error")
        assert answer["status"] == "ready" and answer["config_digest"] == in_force
        assert "thresholdMinTokens" in str(answer["config_error"])
        assert complete(stack, prompt(100))[0] == 200
    finally:
        (stack.dir / "router.json").write_text(good)
    wait_for(lambda: "config_error" not in ready(stack.router), 10, "the good file back in force")


def test_a_router_waits_for_its_config_and_serves_once_it_is_usable(stack: Stack, waiting: tuple[Path, str]) -> None:
    """``--wait-for-config`` (the chart's routers and gateways, whose ConfigMap the operator writes later):
    alive and not ready, with the reason, while the file is missing or invalid; serving once it is usable."""
    path, url = waiting
    wait_for(lambda: httpx.get(url + "/health", timeout=2).status_code == 200, 30, "the waiting router to listen")
    answer = httpx.get(url + "/ready", timeout=2)
    assert answer.status_code == 503 and "cannot read" in answer.json()["error"]["message"], answer.text
    assert metric_value(httpx.get(url + "/metrics", timeout=2).text, "prfaas_router_ready") == 0
    refused = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1}, timeout=5)
    assert refused.status_code == 503 and "no usable configuration yet" in refused.json()["error"]["message"]
    path.write_text(json.dumps({**stack.configs["router"], "thresholdMinTokens": -5}))  # invalid: still waiting

    def reason() -> str:
        return str(httpx.get(url + "/ready", timeout=2).json()["error"]["message"])

    wait_for(lambda: "thresholdMinTokens" in reason(), 10, "the invalid file's reason")
    path.write_text(json.dumps(stack.configs["router"]))
    wait_for(lambda: httpx.get(url + "/ready", timeout=2).status_code == 200, 30, "the router to serve")
    status, body = http("POST", url + "/v1/completions", {"model": "m", "prompt": prompt(500), "max_tokens": 2})
    assert status == 200, body


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def traced(stack: Stack, engine: str, request_id: str) -> list[dict[str, str]]:
    """The tracing headers of ``request_id``'s legs as ``engine`` received them (the emulator's record)."""
    recent = httpx.get(stack.url(engine) + "/admin/state", timeout=5).json()["recent_requests"]
    return [r for r in recent if r.get("x-request-id") == request_id]


def test_trace_context_reaches_the_engines_on_every_leg(stack: Stack) -> None:
    """A client's traceparent and tracestate reach the PD prefill and decode engines, and through the gateway the
    PrFaaS engine, with its x-request-id; without a valid one the router starts a trace both legs share."""

    def send(text: str, request_id: str, **trace: str) -> str:
        body = {"model": "m", "prompt": text, "max_tokens": 2}
        answer = httpx.post(
            stack.router + "/v1/completions", json=body, headers={"x-request-id": request_id, **trace}, timeout=30
        )
        assert answer.status_code == 200, answer.text
        return answer.headers["x-prfaas-route"]

    client = {"traceparent": TRACEPARENT, "tracestate": "client=1"}
    assert send(prompt(2_000), "trace-local", **client) == "local"
    assert send(prompt(40_000), "trace-remote", **client) == "remote"
    for engine, request_id in (("pdp", "trace-local"), ("pdd", "trace-local"), ("prf", "trace-remote"),
                               ("pdd", "trace-remote")):  # fmt: skip
        legs = traced(stack, engine, request_id)
        assert legs and all(leg.get("traceparent") == TRACEPARENT for leg in legs), (engine, legs)
        assert all(leg.get("tracestate") == "client=1" for leg in legs), (engine, legs)
    assert send(prompt(2_000), "trace-new", traceparent="00-not-a-trace", tracestate="x=1") == "local"
    prefill, decode = traced(stack, "pdp", "trace-new"), traced(stack, "pdd", "trace-new")
    assert len(prefill) == len(decode) == 1, (prefill, decode)
    started = prefill[0]["traceparent"]
    assert started == decode[0]["traceparent"] and started.startswith("00-") and started.endswith("-01")
    assert "tracestate" not in prefill[0] and "tracestate" not in decode[0]


def test_gateway_down_opens_the_breaker_and_nothing_is_lost(tmp_path: Path) -> None:
    with processes(tmp_path) as procs:
        st = start_stack(procs, tmp_path)
        gateway = next(p for name, p in procs.procs if name == "gateway")
        gateway.kill()
        gateway.wait(5)
        statuses = [complete(st, prompt(40_000))[0] for _ in range(8)]
        assert statuses == [200] * 8
        assert counter(st.router, "prfaas_router_requests_total", route="remote", outcome="ok") == 0
        unavailable = counter(st.router, "prfaas_router_route_decisions_total", route="local", reason="unavailable")
        fallbacks = counter(st.router, "prfaas_router_fallbacks_total")
        assert unavailable + fallbacks == 8


def test_link_cut_mid_run_still_answers_every_request(tmp_path: Path) -> None:
    with processes(tmp_path) as procs:
        st = start_stack(procs, tmp_path, timeouts={"kvPullSeconds": 2})
        # cut the link to a trickle: KV pulls across it can no longer finish in time
        assert http("POST", st.url("link_admin") + "/admin/link", {"capacity_gbps": 0.001})[0] == 200
        statuses = [complete(st, prompt(40_000))[0] for _ in range(3)]
        assert statuses == [200, 200, 200]
        assert counter(st.router, "prfaas_router_fallbacks_total", reason="decode-kv-pull") >= 1
        assert "decode could not use the remote KV; prefilling locally" in (st.dir / "router.log").read_text()
        # the remote handle the decode could not pull is released through the local decode (across the link)
        assert counter(st.router, "prfaas_router_abandoned_kv_handles_total", cluster="prfaas") >= 1
        wait_for(
            lambda: counter(st.router, "prfaas_router_released_kv_handles_total", cluster="prfaas") >= 1,
            30,
            "the abandoned remote KV released",
        )
