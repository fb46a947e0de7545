"""The legs of vLLM's disaggregated-serving exchange, as a proxy drives them (vllm-router 0.1.17 behaviour):

* prefill leg: the client's body with ``max_tokens: 1``, ``min_tokens: 1``, ``stream: false``, no
  ``stream_options``, and ``kv_transfer_params = {do_remote_decode: true, do_remote_prefill: false,
  remote_engine_id/remote_block_ids/remote_host/remote_port: null}``; the response's ``kv_transfer_params``
  (``do_remote_prefill: true``, ``remote_host``/``remote_port`` = the KV address the prefill side advertises)
  is the KV handle;
* decode leg: the client's body plus that ``kv_transfer_params`` object; its response (a stream or not) is the
  client's answer.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from prfaas_core import names

PREFILL_KV_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


class LegError(Exception):
    """A leg failed before the client's response started; ``retriable`` if another side may succeed."""

    def __init__(self, message: str, status: int = 502, retriable: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.retriable = retriable


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    out = copy.copy(body)
    out.pop("stream_options", None)
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["min_tokens"] = 1
    out["stream"] = False
    out["kv_transfer_params"] = dict(PREFILL_KV_PARAMS)
    return out


def decode_body(body: dict[str, Any], kv_params: dict[str, Any] | None) -> dict[str, Any]:
    out = copy.copy(body)
    if kv_params is not None:
        out["kv_transfer_params"] = kv_params
    else:
        out.pop("kv_transfer_params", None)
    return out


LINK_HEADER = names.HEADER_LINK
"""The link a remote prefill crosses (router -> gateway); the gateway labels its egress with it and never forwards
it to the engine."""
LINK_LABEL = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
UNKNOWN_LINK = "unknown"
"""The gateway's link label for a prefill whose caller named no (valid) link."""


def reported_prompt_tokens(response: Any, fallback: int) -> int:
    """The prompt tokens the engine reported in its answer (``usage.prompt_tokens``; raw bytes or parsed JSON), or
    ``fallback`` (the caller's own count) when the answer carries none."""
    if isinstance(response, bytes | str):
        try:
            response = json.loads(response)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return fallback
    usage = response.get("usage") if isinstance(response, dict) else None
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0 else fallback


def kv_handle(response_json: Any) -> dict[str, Any]:
    """The KV handle of a prefill response; a response without one is an error (never a silent success)."""
    if not isinstance(response_json, dict):
        raise LegError("prefill response is not a JSON object")
    params = response_json.get("kv_transfer_params")
    if not isinstance(params, dict) or not params.get("do_remote_prefill"):
        raise LegError("prefill response carries no kv_transfer_params handle")
    return params
