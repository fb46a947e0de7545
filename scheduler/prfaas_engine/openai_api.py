"""OpenAI-compatible request bodies (as vLLM accepts them) and the response/stream objects vLLM returns.

Bodies are parsed leniently where vLLM is (unknown fields pass: routers and SDKs add many) and strictly where
the emulator acts on a field. One prompt (one choice, ``n = 1``) per request. Without ``max_tokens``
(``max_completion_tokens`` for chat) a request generates the engine's ``default_max_tokens`` (16, OpenAI's
completions default). Generation always runs to ``max_tokens`` (``finish_reason: "length"``): there is no model
to emit an end-of-sequence token.
"""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from prfaas_core.request.tokens import Tokenizer


class BadRequest(ValueError):
    """A request body the API rejects (HTTP 400)."""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    min_tokens: int = Field(default=0, ge=0)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = 1
    kv_transfer_params: dict[str, Any] | None = None
    cache_salt: str | None = Field(default=None, min_length=1, max_length=128, pattern=r"^[^@/\\\x00]+$")
    """vLLM's prefix-cache salt: prompts under different salts share no cached block."""

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int | None) -> int | None:
        if v is not None and v != 1:
            raise ValueError(f"the emulator serves one choice per request (n = 1), got n = {v}")
        return v


class CompletionBody(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: Any) -> Any:
        if isinstance(v, list) and v and isinstance(v[0], str | list) and len(v) != 1:
            raise ValueError(f"the emulator serves one prompt per request (got {len(v)})")
        return v


class ChatBody(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


def parse_body(model: type[_Common], raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise BadRequest("the request body must be a JSON object")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in exc.errors()[:5]
        )
        raise BadRequest(problems) from None


def prompt_ids(body: CompletionBody | ChatBody, tokenizer: Tokenizer) -> list[int]:
    """The prompt's token ids (a chat is rendered by the template first)."""
    if isinstance(body, ChatBody):
        try:
            ids = tokenizer.encode_chat(body.messages)
        except ValueError as exc:
            raise BadRequest(f"messages: {exc}") from None
        return ids
    prompt: Any = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    ids = tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise BadRequest("prompt: the prompt cannot be empty")
    if any(t < 0 for t in ids):
        raise BadRequest("prompt: token ids must be non-negative")
    return ids


def max_tokens(body: CompletionBody | ChatBody, default: int) -> int:
    if isinstance(body, ChatBody) and body.max_completion_tokens is not None:
        return body.max_completion_tokens
    return body.max_tokens if body.max_tokens is not None else default


def usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int, details: bool = True, stream: bool = False
) -> dict[str, Any]:
    """vLLM 0.32's usage object. ``prompt_tokens_details`` only with ``--enable-prompt-tokens-details`` (null
    without it); a whole answer's carries vLLM's null ``created_cache_tokens``/``multimodal_tokens``, a stream's
    final usage chunk only ``cached_tokens`` (both seen on real engines)."""
    prompt_details: dict[str, Any] | None = None
    if details:
        prompt_details = {"cached_tokens": cached_tokens}
        if not stream:
            prompt_details.update(created_cache_tokens=None, multimodal_tokens=None)
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": prompt_details,
    }


def error_body(status: int, message: str) -> dict[str, Any]:
    kinds = {400: "BadRequestError", 404: "NotFoundError", 409: "ConflictError", 500: "InternalServerError"}
    kind = kinds.get(status, "ServiceUnavailableError" if status == 503 else "APIError")
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


class ResponseBuilder:
    """Builds one request's response objects (completion or chat, whole or streamed)."""

    def __init__(self, chat: bool, request_id: str, model: str) -> None:
        self.chat = chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{request_id}"
        self.model = model
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"

    def full(self, text: str, finish_reason: str, use: dict[str, Any], kv: dict[str, Any] | None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": []}
        else:
            choice["text"] = text
        out: dict[str, Any] = {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": use,
        }
        if kv is not None:
            out["kv_transfer_params"] = kv
        return out

    def chunk(self, text: str | None, finish_reason: str | None = None, first: bool = False) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}
        if self.chat:
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }

    def usage_chunk(self, use: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": use,
        }


def sse(obj: dict[str, Any] | str) -> bytes:
    payload = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


def render_response(body: CompletionBody | ChatBody, ids: list[int], request_id: str, model: str, n: int) -> Any:
    """What vLLM's ``/v1/completions/render`` (a list) and ``/v1/chat/completions/render`` (an object) return."""
    prefix = "chatcmpl" if isinstance(body, ChatBody) else "cmpl"
    obj = {
        "request_id": f"{prefix}-{request_id}",
        "token_ids": ids,
        "sampling_params": {"max_tokens": n, "min_tokens": body.min_tokens},
        "model": body.model or model,
        "stream": bool(body.stream),
    }
    return obj if isinstance(body, ChatBody) else [obj]
