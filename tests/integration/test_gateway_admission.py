"""Source-side admission at the gateway, over real sockets against the emulated stack: the gateway books each
prefill's KV pull in its link calendar, declines at once (429 + Retry-After + AdmissionDecline) a prefill whose
window starts later than the caller accepts, and the router goes local on a decline whose predicted TTFT loses
to its local alternative. The gateway's link is made tiny (5 Mbps) so one 40K-token pull holds it for seconds."""

from __future__ import annotations

from pathlib import Path

import httpx
from testbed_support import counter, http, processes, prompt, start_stack, wait_for

from prfaas_core import names
from prfaas_core.api import AdmissionDecline
from prfaas_core.capacity.kv import kv_model_from_profile
from prfaas_core.capacity.profiles import builtin_model_profiles
from prfaas_router.state.wire import parse_timing

KV = kv_model_from_profile(builtin_model_profiles()["internal-1t"])


def test_gateway_books_declines_and_the_router_chooses(tmp_path: Path) -> None:
    with processes(tmp_path) as procs:
        st = start_stack(procs, tmp_path, gateway_admission={"capacityGbps": 0.005}, security={"serverTiming": True})
        router, gateway = st.router, st.url("gateway")
        # the gateway says it schedules the link, and the router reads it from the status it polls
        status_body = httpx.get(gateway + "/status", headers={"Authorization": "Bearer s3cret-token"}, timeout=5)
        assert status_body.json()["scheduledLinks"] == ["a-to-b"]
        wait_for(
            lambda: httpx.get(router + "/ready", timeout=5).json().get("link_calendar") == {"prfaas-h200": True},
            30,
            "the router to read scheduledLinks from the gateway's status",
        )
        body = {"model": "m", "prompt": prompt(40_000), "max_tokens": 4}
        answer = httpx.post(router + "/v1/completions", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-prfaas-route"] == "remote"
        assert counter(router, "prfaas_router_requests_total", route="remote", outcome="ok") == 1
        # where its time went: the router's phases and the gateway's, passed on under gw-
        timing = parse_timing(answer.headers[names.SERVER_TIMING])
        assert {"prefill", "first", "gw-hold", "gw-prefill", "gw-release", "gw-predicted"} <= timing.keys(), timing
        assert 0 < timing["gw-prefill"] <= timing["prefill"] <= timing["first"], timing
        assert timing["gw-predicted"] > 0, timing
        gw_auth = {"Authorization": "Bearer s3cret-token"}
        # the router reported its pull over once its decode held the KV: the link is free again
        wait_for(
            lambda: counter(gateway, names.METRIC_GATEWAY_PULLS, gw_auth, link="a-to-b", end="reported") == 1,
            30,
            "the router's report of its pull",
        )
        # a leg whose pull nobody reports stays on the wire, booked for ~1700 model seconds (6.9 Gbit at the
        # 4 Mbps cap): a leg accepting no wait is declined at once with the earliest start
        leg = {
            "model": "m",
            "prompt": prompt(40_000),
            "max_tokens": 1,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
        }
        headers = {
            "Authorization": "Bearer s3cret-token",
            names.HEADER_KV_BYTES: str(int(KV.kv_bytes(40_000))),
            names.HEADER_MAX_WAIT_MS: "0",
            names.HEADER_LINK: "a-to-b",
        }
        # the reported pull still holds the link until its bytes would have crossed at its booked rate (the
        # emulated wire is faster than booked): a leg accepting 1 ms gets a window once that has passed

        def booked_now() -> list[httpx.Response] | None:
            r = httpx.post(gateway + "/v1/completions", json=leg, headers={**headers, names.HEADER_MAX_WAIT_MS: "1"})
            assert r.status_code in (200, 429), r.text
            return [r] if r.status_code == 200 else None

        first = wait_for(booked_now, 60, "a window for a leg accepting 1 ms, once the first pull's bytes crossed", 0.5)[
            0
        ]
        pull_id = first.headers[names.HEADER_PULL_ID]
        assert {"hold", "prefill", "release", "predicted"} <= parse_timing(first.headers[names.SERVER_TIMING]).keys()
        r = httpx.post(gateway + "/v1/completions", json=leg, headers=headers, timeout=10)
        assert r.status_code == 429, r.text
        decline = AdmissionDecline.model_validate(r.json())
        assert decline.reason == "link_window" and decline.link == "a-to-b"
        assert decline.earliest_start_ms is not None and decline.earliest_start_ms > 100_000
        assert decline.predicted_ttft_ms is not None and decline.predicted_ttft_ms > decline.earliest_start_ms
        assert int(r.headers["Retry-After"]) >= 1
        # malformed admission headers are a 400 naming the header
        bad = httpx.post(
            gateway + "/v1/completions", json=leg, headers={**headers, names.HEADER_KV_BYTES: "lots"}, timeout=10
        )
        assert bad.status_code == 400 and names.HEADER_KV_BYTES in bad.text
        # a router whose view of the link disagrees with the gateway's (another capacity or cap) is refused, the
        # header and the field named; one that agrees is admitted as before (declined here: the link is booked)
        for header, value, field in (
            (names.HEADER_LINK_CAPACITY_GBPS, "100", "capacityGbps"),
            (names.HEADER_LINK_MAX_UTILIZATION, "0.5", "maxUtilization"),
        ):
            bad = httpx.post(gateway + "/v1/completions", json=leg, headers={**headers, header: value}, timeout=10)
            assert bad.status_code == 400 and header in bad.text and field in bad.text, bad.text
        agreeing = {**headers, names.HEADER_LINK_CAPACITY_GBPS: "0.005", names.HEADER_LINK_MAX_UTILIZATION: "0.8"}
        r = httpx.post(gateway + "/v1/completions", json=leg, headers=agreeing, timeout=10)
        assert r.status_code == 429 and AdmissionDecline.model_validate(r.json()).reason == "link_window", r.text
        # through the router: the gateway declines, the remote TTFT loses to local, the router goes local
        status, out = http("POST", router + "/v1/completions", {**body, "prompt": prompt(40_000)}, timeout_s=30)
        assert status == 200, out
        assert counter(router, names.METRIC_ROUTER_LINK_WAITS, link="a-to-b", result="local") == 1
        assert (
            counter(router, names.METRIC_ROUTER_ROUTE_DECISIONS, route="local", reason=names.REASON_WAIT_FOR_LINK) == 1
        )
        assert counter(router, "prfaas_router_requests_total", route="local", outcome="ok") == 1
        assert counter(router, "prfaas_router_fallbacks_total") == 0  # a decline is not a failure
        # the unreported pull, reported over: once, by a caller holding the token
        done = names.PULL_DONE_PATH.format(pull_id=pull_id)
        assert httpx.post(gateway + done, timeout=5).status_code == 401
        assert httpx.post(gateway + done, headers=gw_auth, timeout=5).status_code == 200
        again = httpx.post(gateway + done, headers=gw_auth, timeout=5)
        assert again.status_code == 404 and pull_id in again.text
        assert counter(gateway, names.METRIC_GATEWAY_PULLS, gw_auth, link="a-to-b", end="reported") == 2
        assert counter(gateway, names.METRIC_GATEWAY_PULLS, gw_auth, link="a-to-b", end="lease") == 0
        # the loan endpoints between gateway replicas: the token first, then a gateway without peers (one replica)
        # lends to nobody, whatever it is asked (test_hardening: peers, bounds; test_gateway_security: a real loan)
        loans = gateway + names.LOANS_PATH.format(link="a-to-b")
        ask = {"fraction": 0.5, "leaseS": 10, "replica": "peer-1", "heldAt": 1.7e9}
        assert httpx.post(loans, json=ask, timeout=5).status_code == 401
        refused = httpx.post(loans, json=ask, headers=gw_auth, timeout=5)
        assert refused.status_code == 403 and "gateway.admission.peers" in refused.text
        other = gateway + names.LOANS_PATH.format(link="b-to-c")
        assert httpx.post(other, json=ask, headers=gw_auth, timeout=5).status_code == 404
        loan = gateway + names.LOAN_PATH.format(link="a-to-b", loan_id="x.loan-1")
        assert httpx.delete(loan, headers=gw_auth, timeout=5).status_code == 403
        assert counter(gateway, names.METRIC_GATEWAY_LOANS, gw_auth, link="a-to-b", result="not_peer") == 2
