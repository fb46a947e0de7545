"""The legs of the disaggregated-serving exchange, as a proxy drives them: the prefill leg (one token, a request
for a KV handle), whose answer carries the handle, and the decode leg (the client's body plus that handle), whose
response is the client's answer. The bodies and the handle are the engine kind's
(:mod:`prfaas_core.launch.vllm`, through :func:`prfaas_core.launch.kinds.engine_kind`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from prfaas_core import names
from prfaas_core.launch.kinds import engine_kind

ENGINE = engine_kind()
"""The engine kind the legs speak to."""


class LegError(Exception):
    """A leg failed before the client's response started; ``retriable`` if another side may succeed."""

    def __init__(self, message: str, status: int = 502, retriable: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.retriable = retriable


prefill_body = ENGINE.prefill_body
decode_body = ENGINE.decode_body


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
    handle = ENGINE.kv_handle(response_json)
    if handle is None:
        raise LegError("prefill response carries no KV handle")
    return handle
