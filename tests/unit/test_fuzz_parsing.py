"""Property-based fuzzing of what a client controls at the router's and the gateway's edge: OpenAI bodies
(text, token-id and chat prompts, with the estimate and with a model tokenizer) and headers. Whatever is sent,
parsing answers token ids or a ValueError naming the problem (the router's 400), never another exception."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_model_tokenizer import TEMPLATE, _tokenizer_json

from prfaas_core.request.tokens import ModelTokenizer, build_tokenizer, prompt_token_ids
from prfaas_router.state.security import BODY_FIELDS, TokenAuth, gateway_body, refused_field

JSON: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=30,
)
TOKEN_IDS = st.lists(st.integers(min_value=-(2**70), max_value=2**70), max_size=40)
PROMPT = st.one_of(st.text(max_size=200), TOKEN_IDS, st.lists(st.text(max_size=30), max_size=5),
                   st.lists(TOKEN_IDS, max_size=3), JSON)  # fmt: skip
CONTENT = st.one_of(
    st.text(max_size=80),
    st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "x"]), "text": JSON}), max_size=4),
    JSON,
)
MESSAGES = st.one_of(
    st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "?"]), "content": CONTENT}),
             max_size=5),
    JSON,
)  # fmt: skip
BODY = st.one_of(
    st.fixed_dictionaries({"prompt": PROMPT}, optional={"model": JSON, "max_tokens": JSON, "stream": JSON}),
    st.fixed_dictionaries({"messages": MESSAGES}, optional={"model": JSON, "add_generation_prompt": JSON}),
    st.dictionaries(st.text(max_size=20), JSON, max_size=6),
)
ESTIMATE = build_tokenizer("chars4")
MODEL = ModelTokenizer(_tokenizer_json(), TEMPLATE)


def _parse(body: dict[str, Any], chat: bool, tokenizer: Any) -> None:
    try:
        ids = prompt_token_ids(body, chat, tokenizer)
    except ValueError as exc:
        assert str(exc), "a 400 must say what is wrong"
        return
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)


@settings(max_examples=60)
@given(BODY, st.booleans())
def test_any_body_parses_to_token_ids_or_a_named_error_with_the_estimate(body: dict[str, Any], chat: bool) -> None:
    _parse(body, chat, ESTIMATE)


@settings(max_examples=60)
@given(BODY, st.booleans())
def test_any_body_parses_to_token_ids_or_a_named_error_with_a_model_tokenizer(body: dict[str, Any], chat: bool) -> None:
    _parse(body, chat, MODEL)


HEADERS = st.dictionaries(
    st.one_of(st.sampled_from(["x-prfaas-kv-bytes", "x-prfaas-max-wait-ms", "x-prfaas-link", "X-PrFaaS-Y"]),
              st.text(min_size=1, max_size=20)),
    st.text(max_size=60),
    max_size=6,
)  # fmt: skip


@settings(max_examples=60)
@given(st.dictionaries(st.text(max_size=20), JSON, max_size=8), HEADERS)
def test_the_allow_list_answers_for_any_body_and_headers(body: dict[str, Any], headers: dict[str, str]) -> None:
    why = refused_field(body, headers)
    assert why is None or ("field" in why or "header" in why)
    kept = gateway_body(body)
    assert set(kept) <= BODY_FIELDS and gateway_body(kept) == kept


@given(st.one_of(st.none(), st.text(max_size=80)))
def test_any_authorization_header_is_accepted_or_refused_with_a_reason(header: str | None) -> None:
    auth = TokenAuth(None, None)  # type: ignore[arg-type]
    auth.token = b"the-token"
    why = auth.refusal(header)
    assert why in (None, "missing", "malformed", "wrong")
    assert (why is None) == (header is not None and header.partition(" ")[0].lower() == "bearer"
                             and header.partition(" ")[2].strip() == "the-token")  # fmt: skip
