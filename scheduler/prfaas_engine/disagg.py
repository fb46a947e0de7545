"""The disaggregation protocols a request may carry, parsed into one *leg* the engine serves.

vLLM (NixlConnector / MooncakeConnector as exposed to proxies; vllm-router 0.1.17 sends exactly this):

* prefill leg: ``"kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false, ...nulls}``
  → the engine prefills, returns one token, holds the KV and answers ``kv_transfer_params`` =
  ``{do_remote_prefill: true, do_remote_decode: false, remote_engine_id, remote_block_ids, remote_host,
  remote_port, tp_size: 1}`` (remote_host/port = the *advertised* KV address);
* decode leg: the client's body plus those params → the engine pulls the KV from remote_host:remote_port,
  then decodes.

SGLang (sglang-router 0.3.2 ``--pd-disaggregation``): the same body goes to prefill and decode *concurrently*
with ``bootstrap_host``, ``bootstrap_port`` and ``bootstrap_room`` (a random u64). A prefill-role engine
prefills and holds the KV under the room; a decode-role engine pulls the room from
``bootstrap_host:bootstrap_port`` (waiting for the prefill to finish). A ``both`` engine cannot tell the two
legs apart, so it refuses bootstrap fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prfaas_core.names import ROLE_DECODE, ROLE_PREFILL


class ProtocolError(ValueError):
    """A request the protocol does not allow (HTTP 400); the message names the field."""


@dataclass(frozen=True)
class LocalLeg:
    """Prefill and decode here (no transfer)."""


@dataclass(frozen=True)
class ProduceNixl:
    """vLLM prefill leg: prefill, one token, hold the KV for a remote decode."""


@dataclass(frozen=True)
class ProduceBootstrap:
    """SGLang prefill leg: prefill and hold the KV under ``room``."""

    room: int


@dataclass(frozen=True)
class ConsumeNixl:
    """vLLM decode leg: pull the KV of ``block_ids`` of engine ``engine_id`` from ``host:port``."""

    host: str
    port: int
    engine_id: str
    block_ids: tuple[int, ...]
    remote_cached_tokens: int | None = None
    """``remote_prefill_cached_tokens`` of the handle: what the prefill side reused from its prefix cache (vLLM
    0.32's decode reports this as its ``cached_tokens``, not its own near-100 % hit from the transfer)."""


@dataclass(frozen=True)
class ConsumeBootstrap:
    """SGLang decode leg: pull the KV of ``room`` from the bootstrap server ``host:port``."""

    host: str
    port: int
    room: int


Leg = LocalLeg | ProduceNixl | ProduceBootstrap | ConsumeNixl | ConsumeBootstrap
PRODUCE_LEGS = (ProduceNixl, ProduceBootstrap)
CONSUME_LEGS = (ConsumeNixl, ConsumeBootstrap)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _port(value: Any, field: str) -> int:
    if not _is_int(value) or not 1 <= value <= 65535:
        raise ProtocolError(f"{field} must be a port number (1-65535), got {value!r}")
    return int(value)


def _host(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise ProtocolError(f"{field} must be a non-empty host string, got {value!r}")
    return value


def _nixl_leg(params: Any, role: str) -> Leg:
    if not isinstance(params, dict):
        raise ProtocolError("kv_transfer_params must be an object")
    remote_decode = params.get("do_remote_decode") is True
    remote_prefill = params.get("do_remote_prefill") is True
    if remote_decode and remote_prefill:
        raise ProtocolError("kv_transfer_params: do_remote_decode and do_remote_prefill cannot both be true")
    if remote_decode:
        if role == ROLE_DECODE:
            raise ProtocolError(
                "this engine's role is decode: it cannot prefill for a remote decode (kv_transfer_params."
                "do_remote_decode); send the prefill leg to a prefill or both engine"
            )
        return ProduceNixl()
    if not remote_prefill:
        return LocalLeg()
    if role == ROLE_PREFILL:
        raise ProtocolError(
            "this engine's role is prefill: it cannot decode from a remote prefill (kv_transfer_params."
            "do_remote_prefill); send the decode leg to a decode or both engine"
        )
    engine_id = params.get("remote_engine_id")
    if not isinstance(engine_id, str) or not engine_id:
        raise ProtocolError("kv_transfer_params.remote_engine_id must be the prefill engine's id (a string)")
    block_ids = params.get("remote_block_ids")
    if not isinstance(block_ids, list) or not block_ids or not all(_is_int(b) and b >= 0 for b in block_ids):
        raise ProtocolError("kv_transfer_params.remote_block_ids must be a non-empty list of block ids")
    return ConsumeNixl(
        host=_host(params.get("remote_host"), "kv_transfer_params.remote_host"),
        port=_port(params.get("remote_port"), "kv_transfer_params.remote_port"),
        engine_id=engine_id,
        block_ids=tuple(block_ids),
        remote_cached_tokens=cached if _is_int(cached := params.get("remote_prefill_cached_tokens")) else None,
    )


def _bootstrap_leg(body: dict[str, Any], role: str) -> Leg:
    raw_room = body.get("bootstrap_room")
    if not isinstance(raw_room, int) or isinstance(raw_room, bool) or raw_room < 0:
        raise ProtocolError(f"bootstrap_room must be a non-negative integer, got {raw_room!r}")
    room = int(raw_room)
    if role == ROLE_PREFILL:
        return ProduceBootstrap(room=room)
    if role == ROLE_DECODE:
        return ConsumeBootstrap(
            host=_host(body.get("bootstrap_host"), "bootstrap_host"),
            port=_port(body.get("bootstrap_port"), "bootstrap_port"),
            room=room,
        )
    raise ProtocolError(
        "this engine's role is both: it cannot tell an SGLang prefill leg from a decode leg (bootstrap_*); "
        "run SGLang-style disaggregation with prefill and decode engines"
    )


def plan_leg(body: dict[str, Any], role: str) -> Leg:
    """The leg a request body asks this engine (of ``role``) to serve; :class:`ProtocolError` if it cannot."""
    params = body.get("kv_transfer_params")
    bootstrap = any(body.get(k) is not None for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room"))
    nixl = _nixl_leg(params, role) if params is not None else LocalLeg()
    if bootstrap:
        if not isinstance(nixl, LocalLeg):
            raise ProtocolError("a request cannot carry both kv_transfer_params and bootstrap_* fields")
        return _bootstrap_leg(body, role)
    return nixl
