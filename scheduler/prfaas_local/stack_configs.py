"""What the engine kind changes in the local stack's router and gateway configs (the model, its tokenizer,
the clock and hardware of emulated engines, the block size and timeouts of real vLLM engines on CPU); the rest
of each config is the builder's (:mod:`.stack`)."""

from __future__ import annotations

from typing import Any

from prfaas_core.capacity.profiles import builtin_model_profiles

LINK = "a-to-b"
"""The one link between the regions (its relays, the routers' ``links``)."""

VLLM_TOKEN = "real-tier-token"
"""The gateway's token over real engines (a fixed one: the real tier's tests send it)."""

BLOCK_SIZE = 128
"""The real engines' KV block (``--block-size``), the routers' ``prefixBlockTokens``."""


def emulated_fields(model_profile: str, time_scale: float, byte_scale: float) -> dict[str, Any]:
    """Emulated engines: a built-in model profile, the model clock, H200 PrFaaS and H20 PD hardware."""
    model = builtin_model_profiles()[model_profile].model_dump(mode="json", by_alias=True, exclude_none=True)
    prfaas = {"accelerator": "H200"}
    return {
        "common": {"model": model, "scale": {"timeScale": time_scale, "byteScale": byte_scale}},
        "gateway": {"prfaasHardware": prfaas},
        "router": {"pdHardware": {"accelerator": "H20"}, "prfaasHardware": prfaas},
        "links": None,
    }


def tiny_model_profile(env: Any) -> dict[str, Any]:
    """The tiny model's ModelProfile spec: 2 full-attention layers, 2 KV heads of dim 32, bf16 (512 B/token); or
    the environment's own (the tiny hybrid's, measured by ``prfaas profile``)."""
    if getattr(env, "model_profile", None):
        return dict(env.model_profile)
    return {
        "servedModelName": env.served_model_name,
        "architecture": {"fullAttentionLayers": 2, "kvHeads": 2, "headDim": 32, "kvDtype": "bf16"},
        "tokenizer": {"file": env.tokenizer_file},
    }


def vllm_fields(env: Any) -> dict[str, Any]:
    """Real vLLM engines (``env``: their :class:`~.vllm_engines.RealEnv`): the model's own tokenizer, the engines'
    KV block size as ``prefixBlockTokens`` (the block the engine really uses: a hybrid's profile names it)."""
    model = tiny_model_profile(env)
    block = (model.get("architecture") or {}).get("blockTokens") or BLOCK_SIZE
    return {
        "common": {"model": model, "tokenizerFile": env.tokenizer_file},
        "gateway": {"routing": {"prefixBlockTokens": block, "refreshIntervalSeconds": 0.5}},
        "router": {
            "routing": {"prefixBlockTokens": block, "breakerOpenSeconds": 3},
            # a KV pull on CPU vLLM occasionally stalls for many seconds on a loaded 2-core machine (the decode
            # engine busy-steps while it waits): only a dead producer (vLLM answers 500 within ~5 s) falls back
            "timeouts": {"kvPullSeconds": 120},
        },
        # engines on one host: the "link" is the loopback, whose capacity is not in doubt. A KV pull a loaded CPU
        # decode engine is slow to start would otherwise read as a squeezed link and keep long prompts local for
        # ~20 s (the netns tier, a shaped veth, measures its link: it sets its own links)
        "links": [{"name": LINK, "capacityGbps": 100, "availableBandwidth": "Configured"}],
    }
