"""Parsing the two disaggregation protocols into the leg an engine serves (table-driven)."""

from __future__ import annotations

from typing import Any

import pytest

from prfaas_engine.disagg import (
    ConsumeBootstrap,
    ConsumeNixl,
    LocalLeg,
    ProduceBootstrap,
    ProduceNixl,
    ProtocolError,
    plan_leg,
)

# What vllm-router 0.1.17 sends on the prefill leg (TESTING.md), and what a prefill engine answers.
VLLM_PREFILL = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
VLLM_DECODE = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [7, 8, 9],
    "remote_engine_id": "prefill-0",
    "remote_host": "127.0.0.1",
    "remote_port": 7001,
    "tp_size": 1,
}
SGLANG = {"bootstrap_host": "127.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 2**63 + 5}


@pytest.mark.parametrize(
    ("body", "role", "leg"),
    [
        ({}, "both", LocalLeg()),
        ({"kv_transfer_params": None}, "decode", LocalLeg()),
        ({"kv_transfer_params": {"do_remote_decode": False, "do_remote_prefill": False}}, "prefill", LocalLeg()),
        ({"kv_transfer_params": VLLM_PREFILL}, "prefill", ProduceNixl()),
        ({"kv_transfer_params": VLLM_PREFILL}, "both", ProduceNixl()),
        ({"kv_transfer_params": VLLM_DECODE}, "decode", ConsumeNixl("127.0.0.1", 7001, "prefill-0", (7, 8, 9))),
        ({"kv_transfer_params": VLLM_DECODE}, "both", ConsumeNixl("127.0.0.1", 7001, "prefill-0", (7, 8, 9))),
        (SGLANG, "prefill", ProduceBootstrap(2**63 + 5)),
        (SGLANG, "decode", ConsumeBootstrap("127.0.0.1", 8998, 2**63 + 5)),
    ],
)
def test_legs(body: dict[str, Any], role: str, leg: object) -> None:
    assert plan_leg(body, role) == leg


@pytest.mark.parametrize(
    ("body", "role", "message"),
    [
        ({"kv_transfer_params": VLLM_PREFILL}, "decode", "role is decode"),
        ({"kv_transfer_params": VLLM_DECODE}, "prefill", "role is prefill"),
        ({"kv_transfer_params": "yes"}, "both", "must be an object"),
        ({"kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": True}}, "both", "both be true"),
        ({"kv_transfer_params": {**VLLM_DECODE, "remote_engine_id": None}}, "decode", "remote_engine_id"),
        ({"kv_transfer_params": {**VLLM_DECODE, "remote_block_ids": []}}, "decode", "remote_block_ids"),
        ({"kv_transfer_params": {**VLLM_DECODE, "remote_block_ids": [1, "x"]}}, "decode", "remote_block_ids"),
        ({"kv_transfer_params": {**VLLM_DECODE, "remote_port": 0}}, "decode", "remote_port"),
        ({"kv_transfer_params": {**VLLM_DECODE, "remote_host": ""}}, "decode", "remote_host"),
        (SGLANG, "both", "role is both"),
        ({**SGLANG, "bootstrap_room": -1}, "decode", "bootstrap_room"),
        ({**SGLANG, "bootstrap_room": "1"}, "prefill", "bootstrap_room"),
        ({**SGLANG, "bootstrap_port": None}, "decode", "bootstrap_port"),
        ({**SGLANG, "kv_transfer_params": VLLM_DECODE}, "decode", "both kv_transfer_params and bootstrap"),
    ],
)
def test_protocol_errors_name_the_field(body: dict[str, Any], role: str, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        plan_leg(body, role)
