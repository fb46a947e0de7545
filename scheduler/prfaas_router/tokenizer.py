"""The router's token counter: the served model's own tokenizer when RouterConfig names its file, the character
estimate only when it does not (``routing.tokenizer``).

Reads the files (the core's :class:`~prfaas_core.request.tokens.ModelTokenizer` does no I/O): ``tokenizerFile``, the
chat template (``chatTemplateFile``, else ``chat_template.jinja`` beside the tokenizer, else
``tokenizer_config.json``'s ``chat_template``) and the template's named tokens (``bos_token``, ``eos_token``).
A tokenizer already loaded is reused while its files are unchanged (reloads of the configuration are cheap).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from prfaas_core.api import RouterConfig
from prfaas_core.request.tokens import ModelTokenizer, Tokenizer, build_tokenizer, prompt_token_ids

OFFLOAD_BODY_BYTES = 64 * 1024
"""Bodies at least this large (~16K tokens) are tokenised in a worker thread: a model tokenizer takes ~40 ms for
32K tokens and releases the GIL (ModelTokenizer), so the event loop keeps serving the other requests."""

_cache: dict[tuple[Any, ...], ModelTokenizer] = {}


def _stat_key(*paths: Path | None) -> tuple[Any, ...]:
    key: list[Any] = []
    for p in paths:
        if p is not None and p.exists():
            st = p.stat()
            key.append((str(p), st.st_mtime_ns, st.st_size))
        else:
            key.append((str(p), None))
    return tuple(key)


def _template_tokens(config: dict[str, Any]) -> dict[str, str]:
    out = {}
    for name in ("bos_token", "eos_token"):
        value = config.get(name)
        if isinstance(value, dict):  # older files: {"content": "<s>", ...}
            value = value.get("content")
        if isinstance(value, str):
            out[name] = value
    return out


def load_model_tokenizer(tokenizer_file: str, chat_template_file: str | None = None) -> ModelTokenizer:
    """The model tokenizer from its files; ValueError names the field and the file."""
    path = Path(tokenizer_file)
    config_path = path.with_name("tokenizer_config.json")
    template_path = Path(chat_template_file) if chat_template_file else path.with_name("chat_template.jinja")
    key = _stat_key(path, config_path, template_path)
    if key in _cache:
        return _cache[key]
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"tokenizerFile {tokenizer_file!r} cannot be read: {exc.strerror or exc}") from exc
    config: dict[str, Any] = {}
    if config_path.exists():
        try:
            loaded = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{config_path} is not readable JSON: {exc}") from exc
        if isinstance(loaded, dict):
            config = loaded
    template: str | None = None
    if template_path.exists():
        template = template_path.read_text(encoding="utf-8")
    elif chat_template_file:
        raise ValueError(f"chatTemplateFile {chat_template_file!r} does not exist")
    elif isinstance(config.get("chat_template"), str):
        template = config["chat_template"]
    try:
        tokenizer = ModelTokenizer(text, template, _template_tokens(config), name=f"model:{path}")
    except ValueError as exc:
        raise ValueError(f"tokenizerFile {tokenizer_file!r}: {exc}") from exc
    _cache.clear()  # one model per router: keep only the current one
    _cache[key] = tokenizer
    return tokenizer


def router_tokenizer(config: RouterConfig) -> Tokenizer:
    """What the router counts with for ``config``."""
    if config.tokenizer_file is None:
        return build_tokenizer(config.routing.tokenizer)
    return load_model_tokenizer(config.tokenizer_file, config.chat_template_file)


async def count_prompt(body: dict[str, Any], chat: bool, tokenizer: Tokenizer, body_bytes: int) -> list[int]:
    """The prompt's token ids (:func:`prompt_token_ids`), off the event loop's thread for a large body counted by
    the model's tokenizer. ValueError names the bad field."""
    if tokenizer.exact and body_bytes >= OFFLOAD_BODY_BYTES:
        return await asyncio.to_thread(prompt_token_ids, body, chat, tokenizer)
    return prompt_token_ids(body, chat, tokenizer)
