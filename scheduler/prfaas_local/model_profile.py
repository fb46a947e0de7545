"""``prfaas profile``'s work: a ModelProfile from a model directory (its ``config.json``, through the core's
:func:`~prfaas_core.capacity.model_config.architecture_from_config`), and its check against a served P/D pair:
P/D exchanges at prompt lengths that did not build it, each one's bytes as vLLM's decode engine counts them (its
NIXL transferred-bytes histogram, ``names.VLLM_NIXL_BYTES_TRANSFERRED``, its sum before and after) beside the
profile's prediction (:meth:`~prfaas_core.capacity.kv.KvModel.pulled_kv_bytes`)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from prfaas_core import names
from prfaas_core.api import ModelProfile
from prfaas_core.api.model_profile import KvDtype
from prfaas_core.capacity.kv import kv_model_from_profile
from prfaas_core.capacity.model_config import architecture_from_config
from prfaas_core.launch.kinds import engine_kind
from prfaas_router.state.metrics import sample_sum

VLLM = engine_kind("vllm")
PROFILED_ON = "prfaas.io/profiled-on"
"""The annotation naming the engine and version a profile was checked on."""
PROFILED_FROM = "prfaas.io/profiled-from"


def profile_from_model_dir(
    model_dir: Path,
    name: str,
    block_size: int,
    served_model_name: str | None = None,
    state_dtype: KvDtype = "fp32",
    tokenizer_file: str | None = None,
) -> ModelProfile:
    """The ModelProfile of the model in ``model_dir`` served with ``--block-size block_size``."""
    config = json.loads((model_dir / "config.json").read_text())
    arch = architecture_from_config(config, block_size, state_dtype)
    spec: dict[str, Any] = {"architecture": arch.model_dump(by_alias=True, exclude_none=True)}
    if served_model_name:
        spec["servedModelName"] = served_model_name
    if tokenizer_file:
        spec["tokenizer"] = {"file": tokenizer_file}
    meta = {"name": name, "annotations": {PROFILED_FROM: f"{model_dir.name}/config.json, --block-size {block_size}"}}
    return ModelProfile.model_validate({"metadata": meta, "spec": spec})


@dataclass(frozen=True)
class CheckedLength:
    prompt_tokens: int
    predicted_bytes: float
    measured_bytes: float

    @property
    def error(self) -> float:
        return (self.predicted_bytes - self.measured_bytes) / self.measured_bytes if self.measured_bytes else 1.0


def transferred_bytes(decode_url: str) -> tuple[float, float]:
    """The decode engine's NIXL transferred-bytes histogram (sum, count) so far."""
    text = httpx.get(f"{decode_url}{VLLM.METRICS_PATH}", timeout=10).text
    metric = names.VLLM_NIXL_BYTES_TRANSFERRED
    return sample_sum(text, f"{metric}_sum", {}) or 0.0, sample_sum(text, f"{metric}_count", {}) or 0.0


def engine_version(url: str) -> str:
    """What the engine says it is (vLLM's ``/version``), or ``unknown``."""
    try:
        return f"vllm {httpx.get(f'{url}/version', timeout=5).json()['version']}"
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return "unknown"


@dataclass(frozen=True)
class Exchange:
    """One P/D exchange as the decode engine counted it."""

    prompt_tokens: int
    transferred_bytes: float
    """The NIXL transferred-bytes histogram's sum (``names.VLLM_NIXL_BYTES_TRANSFERRED``), its increase."""
    by_source: dict[str, float]
    """The prompt tokens by source (``names.VLLM_PROMPT_TOKENS_BY_SOURCE``), each source's increase."""
    prefill_by_source: dict[str, float]
    """The same on the prefill engine (its own prefix cache's hit, what it computed)."""


def prompt_tokens_by_source(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}{VLLM.METRICS_PATH}", timeout=10).text
    metric = names.VLLM_PROMPT_TOKENS_BY_SOURCE
    return {source: sample_sum(text, metric, {"source": source}) or 0.0 for source in names.PROMPT_SOURCES}


def pd_exchange(
    prefill_url: str, decode_url: str, prompt: str | list[int], model: str, timeout_s: float = 120.0
) -> Exchange:
    """A prefill leg on ``prefill_url``, then the decode leg that pulls its KV on ``decode_url``, and what the
    decode engine counted for it (it publishes its transfer stats with its next metrics update: waited for)."""
    body = {"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0}
    before, sources = transferred_bytes(decode_url), prompt_tokens_by_source(decode_url)
    prefill_sources = prompt_tokens_by_source(prefill_url)
    r = httpx.post(f"{prefill_url}/v1/completions", json=VLLM.prefill_body(body), timeout=timeout_s)
    r.raise_for_status()
    answer = r.json()
    handle = VLLM.kv_handle(answer)
    if handle is None:
        raise RuntimeError(f"{prefill_url} answered a prefill leg with no KV handle")
    httpx.post(
        f"{decode_url}/v1/completions", json=VLLM.decode_body(body, handle), timeout=timeout_s
    ).raise_for_status()
    deadline = time.monotonic() + 30
    after = transferred_bytes(decode_url)
    while after[1] <= before[1]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{decode_url} counted no KV transfer for a {len(prompt)}-long prompt")
        time.sleep(0.2)
        after = transferred_bytes(decode_url)
    now, prefill_now = prompt_tokens_by_source(decode_url), prompt_tokens_by_source(prefill_url)
    moved = {k: now[k] - sources.get(k, 0.0) for k in now}
    prefilled = {k: prefill_now[k] - prefill_sources.get(k, 0.0) for k in prefill_now}
    return Exchange(int(answer["usage"]["prompt_tokens"]), after[0] - before[0], moved, prefilled)


def check_profile(
    profile: ModelProfile,
    prefill_url: str,
    decode_url: str,
    prompts: Sequence[str],
    model: str,
    timeout_s: float = 120.0,
) -> list[CheckedLength]:
    """One P/D exchange per prompt (fresh prompts: the decode side holds none of them), each one's transferred
    bytes beside the profile's prediction for its prompt tokens (the prefill's ``usage.prompt_tokens``)."""
    kv = kv_model_from_profile(profile.spec)
    out: list[CheckedLength] = []
    for prompt in prompts:
        done = pd_exchange(prefill_url, decode_url, prompt, model, timeout_s)
        out.append(CheckedLength(done.prompt_tokens, kv.pulled_kv_bytes(done.prompt_tokens), done.transferred_bytes))
    return out
