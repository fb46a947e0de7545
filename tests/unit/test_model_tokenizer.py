"""The model's own tokenizer (ModelTokenizer) and the router's loader: exact ids, the chat template, and no
silent fallback to the character estimate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from prfaas_core.api import RouterConfig
from prfaas_core.capacity.profiles import builtin_model_profiles
from prfaas_core.request.tokens import ModelTokenizer, prompt_token_ids
from prfaas_router.state.config import load_model_tokenizer, router_tokenizer

TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VOCAB = {"<|im_start|>": 0, "<|im_end|>": 1, "[UNK]": 2, "hello": 3, "world": 4, "user": 5, "assistant": 6, "\n": 7}


def _tokenizer_json() -> str:
    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split("\n", behavior="isolated"), pre_tokenizers.Split(" ", behavior="removed")]
    )
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    return tok.to_str()


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "tokenizer.json").write_text(_tokenizer_json())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE, "eos_token": "<|im_end|>"}))
    return tmp_path


def test_completion_prompt_uses_the_models_ids() -> None:
    tok = ModelTokenizer(_tokenizer_json(), TEMPLATE)
    assert tok.exact and tok.vocab_size == len(VOCAB)
    assert prompt_token_ids({"prompt": "hello world hello"}, False, tok) == [3, 4, 3]


def test_chat_renders_the_template_and_joins_text_parts_with_newlines() -> None:
    tok = ModelTokenizer(_tokenizer_json(), TEMPLATE)
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]}]
    assert tok.render_chat(msgs) == "<|im_start|>user\nhello\nworld<|im_end|>\n<|im_start|>assistant\n"
    assert prompt_token_ids({"messages": msgs}, True, tok) == [0, 5, 7, 3, 7, 4, 1, 7, 0, 6, 7]


def test_token_ids_outside_the_vocabulary_are_rejected() -> None:
    tok = ModelTokenizer(_tokenizer_json(), TEMPLATE)
    with pytest.raises(ValueError, match=r"\[0, 8\)"):
        prompt_token_ids({"prompt": [1, 2, 8]}, False, tok)
    with pytest.raises(ValueError, match="vocabulary"):
        prompt_token_ids({"prompt": [2**32]}, False, tok)


def test_no_chat_template_is_a_clear_error() -> None:
    tok = ModelTokenizer(_tokenizer_json(), None)
    with pytest.raises(ValueError, match="no chat template"):
        prompt_token_ids({"messages": [{"role": "user", "content": "hi"}]}, True, tok)


def test_bad_tokenizer_json_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"tokenizer\.json"):
        ModelTokenizer("{not json")


def _config(**changes: object) -> RouterConfig:
    model = builtin_model_profiles()["internal-1t"]
    return RouterConfig.model_validate({"pdCluster": "pd", "thresholdMinTokens": 100, "model": model, **changes})


def test_router_loads_the_configured_files_and_never_falls_back(files: Path) -> None:
    tok = router_tokenizer(_config(tokenizerFile=str(files / "tokenizer.json")))
    assert tok.exact and tok.name.startswith("model:")
    assert tok.encode_chat([{"role": "user", "content": "hello"}]) == [0, 5, 7, 3, 1, 7, 0, 6, 7]
    # the estimate only without a tokenizer file
    assert not router_tokenizer(_config()).exact


def test_chat_template_file_beside_the_tokenizer_wins(files: Path) -> None:
    (files / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    tok = load_model_tokenizer(str(files / "tokenizer.json"))
    assert tok.encode_chat([{"role": "user", "content": "world"}]) == [4]


def test_unreadable_tokenizer_file_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"tokenizerFile .* cannot be read"):
        router_tokenizer(_config(tokenizerFile=str(tmp_path / "missing.json")))
    with pytest.raises(ValueError, match="chatTemplateFile"):
        (tmp_path / "tokenizer.json").write_text(_tokenizer_json())
        load_model_tokenizer(str(tmp_path / "tokenizer.json"), str(tmp_path / "nope.jinja"))


async def test_large_prompts_are_counted_off_the_event_loop_with_the_same_ids(
    files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from prfaas_router.state import config as router_tok

    tok = router_tokenizer(_config(tokenizerFile=str(files / "tokenizer.json")))
    body = {"prompt": "hello world " * 8000}
    seen: list[str] = []
    original = router_tok.prompt_token_ids

    def spy(*args: object) -> list[int]:
        seen.append(threading.current_thread().name)
        return original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(router_tok, "prompt_token_ids", spy)
    big = await router_tok.count_prompt(body, False, tok, router_tok.OFFLOAD_BODY_BYTES)
    small = await router_tok.count_prompt({"prompt": "hello"}, False, tok, 20)
    assert big == [3, 4] * 8000 and small == [3]
    assert seen[0] != threading.main_thread().name and seen[1] == threading.main_thread().name
