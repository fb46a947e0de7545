"""The openai SDK through our router on real engines: completions and chat, streamed with usage, and multi-turn
sessions whose prefix the engines reuse (the follow-up turn goes to the instance that holds it)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from conftest import Engines, Prompts, counters, delta
from prfaas_local.stack import LocalStack
from prfaas_local.vllm_engines import RealEnv


@pytest.fixture
def client(stack: LocalStack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=stack.url("router") + "/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def test_completions_streamed_with_usage_match_the_unstreamed_answer(
    client: openai.OpenAI, real_env: RealEnv, prompts: Prompts
) -> None:
    for tokens in (200, 1400):  # local and remote
        prompt = prompts.text(tokens)
        whole = client.completions.create(model=real_env.served_model_name, prompt=prompt, max_tokens=16, temperature=0)
        stream = client.completions.create(
            model=real_env.served_model_name,
            prompt=prompt,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
            if chunk.usage is not None:
                usage = chunk.usage
        assert text == whole.choices[0].text
        assert usage is not None and whole.usage is not None
        assert usage.prompt_tokens == whole.usage.prompt_tokens == prompts.count(prompt)
        assert usage.completion_tokens == 16


def test_chat_streamed_with_usage(client: openai.OpenAI, real_env: RealEnv, prompts: Prompts) -> None:
    messages = [
        {"role": "system", "content": prompts.text(40)},
        {"role": "user", "content": [{"type": "text", "text": prompts.text(30)}, {"type": "text", "text": "ok"}]},
    ]
    whole = client.chat.completions.create(
        model=real_env.served_model_name,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=12,
        temperature=0,
    )
    raw = client.chat.completions.with_raw_response.create(
        model=real_env.served_model_name,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    # the router counted the chat as the engine did: the model's chat template, text parts joined by newlines
    counted = int(raw.headers["x-prfaas-prompt-tokens"])
    text, usage = "", None
    for chunk in raw.parse():
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        if chunk.usage is not None:
            usage = chunk.usage
    assert text == whole.choices[0].message.content
    assert usage is not None and whole.usage is not None
    assert counted == usage.prompt_tokens == whole.usage.prompt_tokens


def test_follow_up_turns_reuse_the_prefix_on_the_instance_that_holds_it(
    client: openai.OpenAI, engines: Engines, real_env: RealEnv, prompts: Prompts
) -> None:
    """Three sessions: each follow-up turn's cached prefix is found on the PD prefill instance that computed the
    first turn (by that engine's own ``local_cache_hit``), and the other instance computes none of it."""
    for _ in range(3):
        history = [
            {"role": "system", "content": prompts.text(250)},
            {"role": "user", "content": prompts.text(60)},
        ]
        before = counters(engines)
        first = client.chat.completions.create(
            model=real_env.served_model_name,
            messages=history,  # type: ignore[arg-type]
            max_tokens=8,
            temperature=0,
        )
        mid = counters(engines)
        computed = {name: delta(before, mid, name, "local_compute") for name in ("pdp0", "pdp1")}
        holder = max(computed, key=lambda n: computed[n])
        other = "pdp1" if holder == "pdp0" else "pdp0"
        assert computed[other] == 0 and first.usage is not None and computed[holder] == first.usage.prompt_tokens
        history += [
            {"role": "assistant", "content": first.choices[0].message.content or ""},
            {"role": "user", "content": prompts.text(60)},
        ]
        second = client.chat.completions.create(
            model=real_env.served_model_name,
            messages=history,  # type: ignore[arg-type]
            max_tokens=8,
            temperature=0,
        )
        after = counters(engines)
        assert second.usage is not None
        hit = delta(mid, after, holder, "local_cache_hit")
        assert hit >= 256, f"{holder} reused {hit} tokens of the {first.usage.prompt_tokens}-token first turn"
        assert delta(mid, after, other, "local_compute") == 0
        assert delta(mid, after, holder, "local_compute") + hit == second.usage.prompt_tokens
