"""OpenAI request bodies as the emulator accepts them, and vLLM's render shapes."""

from __future__ import annotations

from typing import Any

import pytest

from prfaas_core.request.tokens import CharEstimateTokenizer
from prfaas_engine import openai_api as api

TOK = CharEstimateTokenizer(4)


def test_completion_prompt_forms() -> None:
    for prompt in ("abcdefgh", ["abcdefgh"]):
        body = api.parse_body(api.CompletionBody, {"model": "m", "prompt": prompt})
        assert len(api.prompt_ids(body, TOK)) == 2
    body = api.parse_body(api.CompletionBody, {"prompt": [5, 6, 7]})
    assert api.prompt_ids(body, TOK) == [5, 6, 7]
    body = api.parse_body(api.CompletionBody, {"prompt": [[5, 6]]})
    assert api.prompt_ids(body, TOK) == [5, 6]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], "JSON object"),
        ({"model": "m"}, "prompt"),
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "hi", "n": 2}, "one choice"),
        ({"prompt": ["a", "b"]}, "one prompt per request"),
        ({"prompt": "hi", "stream": "maybe"}, "stream"),
    ],
)
def test_bad_completion_bodies_name_the_field(raw: Any, message: str) -> None:
    with pytest.raises(api.BadRequest, match=message):
        api.parse_body(api.CompletionBody, raw)


def test_empty_prompts_and_negative_ids_are_refused() -> None:
    with pytest.raises(api.BadRequest, match="empty"):
        api.prompt_ids(api.parse_body(api.CompletionBody, {"prompt": ""}), TOK)
    with pytest.raises(api.BadRequest, match="non-negative"):
        api.prompt_ids(api.parse_body(api.CompletionBody, {"prompt": [1, -2]}), TOK)


def test_chat_bodies() -> None:
    with pytest.raises(api.BadRequest, match="messages"):
        api.parse_body(api.ChatBody, {"messages": []})
    body = api.parse_body(api.ChatBody, {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 7})
    assert api.max_tokens(body, 16) == 7
    body = api.parse_body(api.ChatBody, {"messages": [{"role": "user", "content": "hi"}]})
    assert api.max_tokens(body, 16) == 16
    with pytest.raises(api.BadRequest, match="messages"):
        api.prompt_ids(api.parse_body(api.ChatBody, {"messages": [{"content": "no role"}]}), TOK)


def test_unknown_fields_pass_as_routers_add_many() -> None:
    raw = {"prompt": "hi", "no_stop_trim": False, "return_hidden_states": False, "min_tokens": 1}
    assert api.parse_body(api.CompletionBody, raw).min_tokens == 1


def test_render_shapes_follow_vllm() -> None:
    comp = api.parse_body(api.CompletionBody, {"prompt": "abcdefgh", "model": "m"})
    out = api.render_response(comp, [1, 2], "r1", "served", 16)
    assert isinstance(out, list) and out[0]["token_ids"] == [1, 2] and out[0]["request_id"] == "cmpl-r1"
    assert set(out[0]) >= {"token_ids", "sampling_params", "model", "request_id"}
    chat = api.parse_body(api.ChatBody, {"messages": [{"role": "user", "content": "x"}]})
    obj = api.render_response(chat, [3], "r2", "served", 16)
    assert isinstance(obj, dict) and obj["request_id"] == "chatcmpl-r2" and obj["model"] == "served"


def test_error_body_is_openai_shaped() -> None:
    assert api.error_body(400, "bad")["error"] == {
        "message": "bad",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
