"""Issue 39 items 5 and 6 over real sockets against the emulated stack (one PrFaaS engine behind a gateway that
schedules its link, one pull on the wire at a time):

* a KV handle the gateway gives up on is released at once: an answer held for the wire past 80 % of the KV lease is
  declined ``kv_lease`` with its handle, and the router has its decode instance release it (before: the handle was
  dropped and the PrFaaS engine held the KV until its own lease ran out, 480 s in the emulator);
* the gateway verifies what a router claims: ``x-prfaas-kv-bytes: 0`` no longer skips the pull accounting, a
  decode-cached claim past the prompt gets no credit, a TTFT objective tighter than the gateway's SLO is raised to
  it; each correction is counted (before: taken as claimed)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from testbed_support import GATEWAY_AUTH, Stack, counter, http, processes, prompt, start_stack, wait_for

from prfaas_core import names
from prfaas_core.api import AdmissionDecline
from prfaas_core.launch.vllm import release_body

KV_LEASE_S = 1.0
"""The lease the gateway assumes here (the emulated engines hold the KV 480 s: the test tells a release from an
expiry)."""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("gateway-claims")
    with processes(tmp) as procs:
        yield start_stack(
            procs,
            tmp,
            gateway_admission={"capacityGbps": 8.0, "pullGbps": 8.0, "kvLeaseSeconds": KV_LEASE_S},
            gateway_extra={"slo": {"ttft": {"baseSeconds": 2.0, "secondsPerKTokens": 0.1}}},
        )


def leg(tokens: int) -> dict[str, object]:
    return {
        "model": "m",
        "prompt": prompt(tokens),
        "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
    }


def gw_metric(stack: Stack, name: str, **labels: str) -> float:
    return counter(stack.url("gateway"), name, GATEWAY_AUTH, **labels)


def prfaas_handles(stack: Stack) -> int:
    return int(http("GET", stack.url("prf") + "/admin/state")[1]["kv_handles"])


def release(stack: Stack, handle: dict[str, object]) -> None:
    """Have the PD decode engine release a handle this test holds (the router's release leg)."""
    http("POST", stack.url("pdd") + "/v1/completions", release_body(handle))


def book(stack: Stack, tokens: int, headers: dict[str, str]) -> httpx.Response:
    """A leg with ``headers``, once the gateway books it (a previous pull's bytes crossed the link)."""

    def booked() -> httpx.Response | None:
        r = httpx.post(
            stack.url("gateway") + "/v1/completions", json=leg(tokens), headers={**GATEWAY_AUTH, **headers}, timeout=30
        )
        assert r.status_code in (200, 429), r.text
        return r if r.status_code == 200 else None

    return wait_for(booked, 30, "the gateway to book a leg", 0.5)


def report(stack: Stack, pull_id: str) -> None:
    done = stack.url("gateway") + names.PULL_DONE_PATH.format(pull_id=pull_id)
    assert httpx.post(done, headers=GATEWAY_AUTH, timeout=5).status_code == 200


def test_a_handle_the_gateway_gives_up_on_is_released_by_the_router_at_once(stack: Stack) -> None:
    gateway = stack.url("gateway")
    assert stack.configs["gateway"]["gateway"]["admission"]["kvLeaseSeconds"] == KV_LEASE_S
    # a pull nobody reports holds the wire (a caller with the token acting as a router that never reports)
    first = httpx.post(gateway + "/v1/completions", json=leg(40_000), headers=GATEWAY_AUTH, timeout=30)
    assert first.status_code == 200, first.text
    held_handle = first.json()["kv_transfer_params"]
    released = counter(stack.router, names.METRIC_ROUTER_RELEASED_KV, cluster="prfaas")
    try:
        assert prfaas_handles(stack) == 1
        # the router's long request: booked, prefilled, then held for the wire until 80 % of the lease: 429
        # kv_lease with its handle; the router releases that handle through its decode and prefills locally
        body = {"model": "m", "prompt": prompt(40_000), "max_tokens": 2}
        r = httpx.post(stack.router + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.headers["x-prfaas-route"] == "local"
        assert gw_metric(stack, names.METRIC_GATEWAY_ADMISSIONS, link="a-to-b", result="kv_lease") == 1
        wait_for(
            lambda: counter(stack.router, names.METRIC_ROUTER_RELEASED_KV, cluster="prfaas") == released + 1 or None,
            15,
            "the router to release the handle the gateway gave up on",
        )
        wait_for(lambda: prfaas_handles(stack) == 1 or None, 15, "the PrFaaS engine to free it (480 s lease)")
        assert counter(stack.url("prf"), names.METRIC_ENGINE_KV_EXPIRED) == 0
        # the decline a caller sees carries the handle to release
        again = httpx.post(gateway + "/v1/completions", json=leg(40_000), headers=GATEWAY_AUTH, timeout=30)
        assert again.status_code == 429, again.text
        decline = AdmissionDecline.model_validate(again.json())
        assert decline.reason == "kv_lease" and decline.kv_handle is not None
        release(stack, decline.kv_handle)
    finally:
        report(stack, first.headers[names.HEADER_PULL_ID])
        release(stack, held_handle)
    wait_for(lambda: prfaas_handles(stack) == 0 or None, 15, "the engine to free the test's own handles")


def test_the_gateway_verifies_what_a_router_claims(stack: Stack) -> None:
    def corrected(claim: str) -> float:
        return gw_metric(stack, names.METRIC_GATEWAY_CLAIMS_CORRECTED, link="a-to-b", claim=claim)

    before = {c: corrected(c) for c in ("kv_bytes", "decode_cached", "slo_ttft")}
    claims = {
        names.HEADER_KV_BYTES: "0",  # once: no pull id, not held, not counted on the wire
        names.HEADER_DECODE_CACHED_TOKENS: "1000000",  # more than the prompt
        names.HEADER_SLO_TTFT_MS: "1",  # tighter than the gateway's SLO (2 s + 0.1 s per 1K tokens)
        names.HEADER_LINK: "a-to-b",
    }

    r = book(stack, 20_000, claims)
    # its pull is on the wire under the gateway's own count: it has an id to report, and the link counts it
    pull_id = r.headers.get(names.HEADER_PULL_ID)
    assert pull_id, r.headers
    try:
        assert corrected("kv_bytes") == before["kv_bytes"] + 1
        assert corrected("decode_cached") == before["decode_cached"] + 1
        assert corrected("slo_ttft") == before["slo_ttft"] + 1
        assert "a router's claim corrected" in (stack.dir / "gateway.log").read_text()
    finally:
        report(stack, pull_id)
        release(stack, r.json()["kv_transfer_params"])
    # an honest claim stands: the gateway's own count, a decode holding nothing, a looser objective
    honest = {names.HEADER_SLO_TTFT_MS: "60000", names.HEADER_LINK: "a-to-b"}
    r = book(stack, 20_000, honest)
    report(stack, r.headers[names.HEADER_PULL_ID])
    release(stack, r.json()["kv_transfer_params"])
    assert corrected("kv_bytes") == before["kv_bytes"] + 1 and corrected("slo_ttft") == before["slo_ttft"] + 1
