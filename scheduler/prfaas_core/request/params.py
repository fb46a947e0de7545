"""The OpenAI request's parameters checked before any leg is sent (the router validates the whole request, the
decode leg's parameters included, so that an invalid one costs no engine work: a prefill leg forces
``max_tokens: 1`` and would run a whole prefill only for the decode to reject it).

The bounds are those vLLM's OpenAI server enforces (``SamplingParams._verify_args``), each failure a
``ValueError`` naming the field and why. Unknown fields pass, as they do in vLLM (SDKs and routers add many).
"""

from __future__ import annotations

import hashlib
from typing import Any

MAX_GENERATED_TOKENS = 1 << 20
"""The most tokens one request may ask for (far above any served context)."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _int_field(body: dict[str, Any], name: str, lo: int, hi: int) -> int | None:
    if name not in body or body[name] is None:
        return None
    v = body[name]
    if not _is_int(v):
        raise ValueError(f"'{name}' must be an integer, got {v!r}")
    if not lo <= v <= hi:
        raise ValueError(f"'{name}' must lie in [{lo}, {hi}], got {v}")
    return int(v)


def _number_field(body: dict[str, Any], name: str, lo: float, hi: float, lo_open: bool = False) -> None:
    if name not in body or body[name] is None:
        return
    v = body[name]
    if not _is_number(v) or v != v:  # NaN is not a number here
        raise ValueError(f"'{name}' must be a number, got {v!r}")
    if v < lo or v > hi or (lo_open and v == lo):
        interval = f"({lo:g}, {hi:g}]" if lo_open else f"[{lo:g}, {hi:g}]"
        raise ValueError(f"'{name}' must lie in {interval}, got {v:g}")


def _bool_field(body: dict[str, Any], name: str) -> None:
    if name in body and body[name] is not None and not isinstance(body[name], bool):
        raise ValueError(f"'{name}' must be a boolean, got {body[name]!r}")


def check_request(body: dict[str, Any], chat: bool) -> None:
    """Every parameter a leg acts on, typed and bounded; ValueError names the first bad field."""
    if "model" in body and body["model"] is not None and not isinstance(body["model"], str):
        raise ValueError(f"'model' must be a string, got {body['model']!r}")
    max_tokens = _int_field(body, "max_tokens", 1, MAX_GENERATED_TOKENS)
    if chat:
        max_tokens = _int_field(body, "max_completion_tokens", 1, MAX_GENERATED_TOKENS) or max_tokens
    min_tokens = _int_field(body, "min_tokens", 0, MAX_GENERATED_TOKENS)
    if min_tokens is not None and max_tokens is not None and min_tokens > max_tokens:
        raise ValueError(f"'min_tokens' ({min_tokens}) must not exceed the maximum tokens ({max_tokens})")
    _cache_salt(body)
    _int_field(body, "n", 1, 128)
    _int_field(body, "best_of", 1, 128)
    _int_field(body, "seed", -(1 << 63), (1 << 64) - 1)
    _int_field(body, "top_k", -1, 1 << 31)
    _number_field(body, "temperature", 0.0, 1e4)
    _number_field(body, "top_p", 0.0, 1.0, lo_open=True)
    _number_field(body, "min_p", 0.0, 1.0)
    _number_field(body, "presence_penalty", -2.0, 2.0)
    _number_field(body, "frequency_penalty", -2.0, 2.0)
    _number_field(body, "repetition_penalty", 0.0, 1e4, lo_open=True)
    for name in ("stream", "echo", "ignore_eos", "skip_special_tokens", "add_generation_prompt"):
        _bool_field(body, name)
    if chat:
        _bool_field(body, "logprobs")
        _int_field(body, "top_logprobs", 0, 20)
    else:
        _int_field(body, "logprobs", 0, 20)
    stop = body.get("stop")
    if (
        stop is not None
        and not isinstance(stop, str)
        and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise ValueError("'stop' must be a string or a list of strings")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise ValueError("'stream_options' must be an object")
        if not body.get("stream"):
            raise ValueError("'stream_options' may be set only when 'stream' is true")


def check_context(body: dict[str, Any], chat: bool, prompt_tokens: int, max_model_len: int) -> None:
    """The request within the model's maximum context length (vLLM's own check, made before any leg: once a 35K
    prompt with ``max_tokens`` 250,000 ran a whole remote prefill, then the decode refused it; a 7-MB prompt got a
    retryable 429): the prompt plus the tokens asked for (``max_tokens``, or ``max_completion_tokens`` in a chat;
    at least one) at most ``max_model_len``. ValueError names the fields; call after :func:`check_request`."""
    asked = body.get("max_completion_tokens") if chat and body.get("max_completion_tokens") else body.get("max_tokens")
    asked = asked if _is_int(asked) else None
    if prompt_tokens + (asked or 1) <= max_model_len:
        return
    field = "max_completion_tokens" if chat and body.get("max_completion_tokens") else "max_tokens"
    wants = f"{prompt_tokens} in the prompt" + (f" + {asked} in '{field}'" if asked else "")
    raise ValueError(
        f"the model's maximum context length is {max_model_len} tokens (its engines' max_model_len); the request "
        f"asks for {prompt_tokens + (asked or 1)} ({wants}): shorten the prompt or lower '{field}'"
    )


def _cache_salt(body: dict[str, Any]) -> None:
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not 0 < len(salt) <= 128 or any(c in salt for c in "@/\\\0")):
        raise ValueError("'cache_salt' must be a non-empty string of at most 128 characters, no '@', '/', '\\', NUL")


def tenant_salt(tenant: str | None, client_salt: object = None) -> str:
    """The ``cache_salt`` the router sets in multi-tenant mode (``security.tenantHeader``): SHA-256 of the tenant
    (the header's value; none: one shared salt) and the client's own salt, in hex (64 characters, as vLLM takes
    it). Prompts of different tenants then share no prefix-cache block on any engine."""
    own = client_salt if isinstance(client_salt, str) else ""
    return hashlib.sha256(b"prfaas-tenant\0" + (tenant or "").encode() + b"\0" + own.encode()).hexdigest()
