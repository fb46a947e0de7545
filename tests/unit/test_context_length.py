"""The context length checked before any leg (issue 39 item 9): the prompt plus the tokens asked for within the
engines' max_model_len, a 400 naming the field."""

from __future__ import annotations

import pytest

from prfaas_core.request.params import check_context


def test_the_prompt_and_max_tokens_must_fit_the_context() -> None:
    check_context({"max_tokens": 4}, False, 1000, 1004)
    with pytest.raises(ValueError, match=r"maximum context length is 262144 tokens.*35000 in the prompt \+ 250000"):
        check_context({"max_tokens": 250_000}, False, 35_000, 262_144)
    with pytest.raises(ValueError, match="'max_tokens'"):
        check_context({"max_tokens": 5}, False, 1000, 1004)


def test_without_max_tokens_the_prompt_alone_must_leave_one_token() -> None:
    check_context({}, False, 1003, 1004)
    with pytest.raises(ValueError, match="1004 in the prompt"):
        check_context({}, False, 1004, 1004)


def test_a_chat_counts_max_completion_tokens() -> None:
    with pytest.raises(ValueError, match="'max_completion_tokens'"):
        check_context({"max_completion_tokens": 10, "max_tokens": 1}, True, 1000, 1004)
    check_context({"max_tokens": 4}, True, 1000, 1004)
