"""The gateway's token check and forwarding allow-list as pure functions (the integration tests drive them
through a real gateway process)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from prfaas_router.state.security import (
    RequestIds,
    SecurityMetrics,
    TokenAuth,
    forwarded_headers,
    gateway_body,
    refused_field,
)


def test_the_old_token_is_accepted_only_within_the_overlap(tmp_path: Path) -> None:
    now = [100.0]
    token = tmp_path / "token"
    token.write_text("old\n")
    auth = TokenAuth(str(token), SecurityMetrics(CollectorRegistry()), overlap_s=5.0, clock=lambda: now[0])
    assert auth.refusal("Bearer old") is None
    token.write_text("new\n")
    assert auth.poll() is True
    assert auth.refusal("Bearer new") is None and auth.refusal("Bearer old") is None
    now[0] += 5.1
    assert auth.refusal("Bearer old") == "expired"
    assert auth.refusal("Bearer new") is None
    assert auth.refusal(None) == "missing" and auth.refusal("Basic x") == "malformed"
    assert auth.refusal("Bearer nope") == "wrong"


def test_an_unreadable_new_token_keeps_the_last_good_one(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("good")
    metrics = SecurityMetrics(CollectorRegistry())
    auth = TokenAuth(str(token), metrics)
    token.unlink()
    assert auth.poll() is False
    assert auth.refusal("Bearer good") is None
    labels = {"credential": "token", "result": "rejected"}
    assert metrics.registry.get_sample_value("prfaas_router_credential_reloads_total", labels) == 1


def test_the_router_sends_only_allow_listed_fields_and_the_gateway_names_any_other() -> None:
    body = {"model": "m", "prompt": "p", "logprobs": 3, "kv_transfer_params": {"do_remote_decode": True}}
    assert refused_field(body, {}) is not None and "'logprobs'" in (refused_field(body, {}) or "")
    assert refused_field(gateway_body(body), {}) is None
    assert refused_field(gateway_body(body), {"X-Prfaas-Other": "1"}) is not None
    assert refused_field(gateway_body(body), {"x-prfaas-max-wait-ms": "nan"}) is not None
    assert refused_field(gateway_body(body), {"x-prfaas-max-wait-ms": "12.5", "x-prfaas-link": "ab"}) is None
    assert forwarded_headers({"x-request-id": "t", "x-prfaas-link": "ab", "Authorization": "Bearer s"}) == {
        "x-request-id": "t"
    }


def test_the_ledger_key_is_the_routers_own() -> None:
    a, b = RequestIds("k1", "same"), RequestIds("k2", "same")
    assert a.key != b.key and a.trace == b.trace == "same"
    assert RequestIds("k3").trace == "prfaas-k3"
