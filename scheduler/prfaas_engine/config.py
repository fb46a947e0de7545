"""The engine emulator's configuration: one frozen object built by the CLI (or a test) and passed down."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Literal

from prfaas_core.api.model_profile import ModelProfileSpec
from prfaas_core.capacity.hardware import HardwareProfile, builtin_hardware
from prfaas_core.capacity.kv import KvModel, kv_model_from_profile
from prfaas_core.capacity.profiles import builtin_model_profiles
from prfaas_core.launch.emulation import ScaleSettings
from prfaas_core.names import ROLE_BOTH, ROLE_DECODE, ROLE_PREFILL

Role = Literal["prefill", "decode", "both"]
ROLES: tuple[Role, ...] = (ROLE_PREFILL, ROLE_DECODE, ROLE_BOTH)


class ConfigError(ValueError):
    """A setting that cannot work; the message names it."""


@dataclass(frozen=True)
class HostPort:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str, what: str = "address") -> HostPort:
        host, sep, port = text.rpartition(":")
        if not sep or not host:
            raise ConfigError(f"{what}: expected HOST:PORT, got {text!r}")
        try:
            number = int(port)
        except ValueError:
            raise ConfigError(f"{what}: port must be a number, got {port!r}") from None
        if not 0 <= number <= 65535:
            raise ConfigError(f"{what}: port {number} out of range")
        return cls(host.strip("[]"), number)

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class EngineConfig:
    """Everything an engine needs; defaults follow the paper's hardware (H200 prefill, H20 otherwise).

    Times that belong to the emulated machine (prefill, decode steps) are model seconds, scaled by
    ``scale.time_scale``; ``kv_timeout_s`` and ``bootstrap_wait_s`` are infrastructure timeouts in wall seconds.
    """

    role: Role = ROLE_BOTH
    host: str = "127.0.0.1"
    port: int = 8000
    hardware: str | None = None
    """Accelerator class with a built-in profile (H200, H20); None: H200 for role prefill, else H20."""
    served_model_name: str | None = None
    """Name in /v1/models and responses; any requested name is accepted. None: the model profile's name."""
    model_profile: str = "internal-1t"
    """Model profile giving S_kv(l): a built-in one's name (prfaas_core.capacity.profiles), or the name of
    ``model_profile_spec``."""
    model_profile_spec: ModelProfileSpec | None = None
    """A ModelProfile's spec (e.g. measured by ``prfaas profile``) instead of a built-in one. A hybrid's
    ``blockTokens`` is the block the engine uses (as vLLM enlarges ``--block-size`` to it)."""
    scale: ScaleSettings = field(default_factory=ScaleSettings)
    max_batch: int | None = None
    """Running requests at most (vLLM max_num_seqs); None: the hardware's decode BS_max."""
    max_waiting: int = 4096
    """Waiting requests at most; more are refused with 503."""
    max_model_len: int = 262_144
    block_size_tokens: int = 16
    kv_cache_blocks: int = 65_536
    """KV blocks of the instance (vLLM num_gpu_blocks): admission waits for free blocks."""
    prefix_cache_blocks: int = 65_536
    """Capacity of the prefix cache (hashed full blocks, LRU)."""
    prefill_chunk_tokens: int = 8192
    """Chunked prefill: decode steps of other requests interleave between chunks."""
    default_max_tokens: int = 16
    tokenizer: str = "chars4"
    kv_listen: HostPort | None = None
    """Where the KV server listens (NIXL side channel and SGLang bootstrap). None: host, an ephemeral port."""
    kv_advertise: HostPort | None = None
    """KV address put in kv_transfer_params (remote_host/remote_port); None: the listening address."""
    kv_timeout_s: float = 480.0
    """KV held for a remote decode is freed after this: older vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT default.
    vLLM 0.32's NixlConnector holds it under a lease instead (``kv_lease_duration``, 30 s, extended by the
    heartbeats of a decode waiting for it; measured on the real engines); a decode that rejects the handle frees
    it at once (the router's release leg)."""
    bootstrap_wait_s: float = 30.0
    """An SGLang decode waits this long for its bootstrap room to be prefilled."""
    enable_prompt_tokens_details: bool = False
    """vLLM's ``--enable-prompt-tokens-details``: usage carries ``prompt_tokens_details.cached_tokens`` (null
    without it, vLLM's default)."""
    engine_id: str = field(default_factory=lambda: f"prfaas-{uuid.uuid4().hex[:12]}")
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ConfigError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if self.hardware is not None and builtin_hardware(self.hardware) is None:
            raise ConfigError(f"hardware {self.hardware!r} has no built-in profile (H200, H20)")
        if self.model_profile_spec is None and self.model_profile not in builtin_model_profiles():
            known = ", ".join(sorted(builtin_model_profiles()))
            raise ConfigError(f"model profile {self.model_profile!r} is unknown (built-in: {known})")
        positive = ("max_waiting", "max_model_len", "block_size_tokens", "kv_cache_blocks", "prefill_chunk_tokens")
        for name in (*positive, "prefix_cache_blocks", "default_max_tokens"):
            if getattr(self, name) < (1 if name in positive else 0):
                raise ConfigError(f"{name} must be {'>= 1' if name in positive else '>= 0'}")
        if self.max_batch is not None and self.max_batch < 1:
            raise ConfigError("max_batch must be >= 1")
        if self.kv_timeout_s <= 0 or self.bootstrap_wait_s <= 0:
            raise ConfigError("kv_timeout_s and bootstrap_wait_s must be > 0")

    @property
    def hardware_profile(self) -> HardwareProfile:
        name = self.hardware or ("H200" if self.role == ROLE_PREFILL else "H20")
        profile = builtin_hardware(name)
        assert profile is not None  # checked in __post_init__; H200/H20 are built in
        return profile

        if self.model_profile_spec is not None:
            try:
                kv_model_from_profile(self.model_profile_spec)
            except ValueError as exc:
                raise ConfigError(f"model profile {self.model_profile!r}: {exc}") from None

    @property
    def profile_spec(self) -> ModelProfileSpec:
        if self.model_profile_spec is not None:
            return self.model_profile_spec
        return builtin_model_profiles()[self.model_profile]

    @property
    def kv_model(self) -> KvModel:
        return kv_model_from_profile(self.profile_spec).with_default_blocks(self.block_size_tokens)

    @property
    def block_tokens(self) -> int:
        """The KV block the engine really uses: the profile's ``blockTokens`` (a hybrid's enlarged attention
        block), else ``block_size_tokens``."""
        return self.kv_model.block_tokens or self.block_size_tokens

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_profile

    @property
    def batch_limit(self) -> int:
        if self.max_batch is not None:
            return self.max_batch
        decode = self.hardware_profile.decode
        return decode.max_batch_size if decode is not None else 32
