"""How the engines of a cluster are started: the parts of the engine command line a cluster's resources own.

Read by :mod:`prfaas_core.launch.render`, which turns a PrefillCluster or PDCluster (with its ModelProfile and
``kvTransport``) into one :class:`~prfaas_core.launch.engines.EngineSpec` per role and so, through the one engine-flag
function, into container args and env (``prfaas engines``, the chart's engine workloads, the operator's
``EngineConfig`` condition).
"""

from __future__ import annotations

from pydantic import Field

from .base import ApiModel, CelRule


class EngineSettingsSpec(ApiModel):
    """Engine settings of every instance of one cluster (vLLM's OpenAI server)."""

    __cel_rules__ = (
        CelRule(
            rule="!has(self.sideChannelPort) || self.sideChannelPort != self.port",
            message="sideChannelPort must differ from the engine's HTTP port (both listen in the same pod)",
            check=lambda e: e.side_channel_port is None or e.side_channel_port != e.port,
            field_path=".sideChannelPort",
        ),
        CelRule(
            rule="!has(self.kvEventsPort) || (self.kvEventsPort != self.port && (!has(self.sideChannelPort) || "
            "self.kvEventsPort != self.sideChannelPort))",
            message="kvEventsPort must differ from the engine's HTTP port and its side-channel port",
            check=lambda e: e.kv_events_port is None or e.kv_events_port not in (e.port, e.side_channel_port),
            field_path=".kvEventsPort",
        ),
    )

    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="Model path in the engine pod (or hub name); default: the ModelProfile's servedModelName.",
    )
    port: int = Field(default=8000, ge=1, le=65_535, description="The engine's HTTP (OpenAI and /metrics) port.")
    side_channel_port: int | None = Field(
        default=None,
        ge=1,
        le=65_535,
        description="NIXL side-channel port (VLLM_NIXL_SIDE_CHANNEL_PORT) or Mooncake bootstrap port; default: "
        "kvTransport.sideChannelPort, else the connector's default (5600 NIXL, 8998 Mooncake).",
    )
    kv_events_port: int | None = Field(
        default=None,
        ge=1,
        le=65_535,
        description="Port of the engines' KV event publisher (vLLM's --kv-events-config, ZMQ); the routers then keep "
        "their prefix index of each engine exactly from its events. Unset: no events (learned from routing).",
    )
    block_size: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="KV block size in tokens (--block-size); the same number as RouterConfig's prefixBlockTokens "
        "and the same on both ends of a link. Default: the engine's (16 on GPUs, 128 on CPU).",
    )
    tensor_parallel_size: int | None = Field(
        default=None, ge=1, le=1024, description="--tensor-parallel-size; default: hardware.gpusPerInstance."
    )
    max_model_len: int | None = Field(default=None, ge=1, le=10_000_000, description="--max-model-len.")
    enforce_eager: bool = Field(default=False, description="--enforce-eager (no graph capture).")
    extra_args: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="More engine arguments, appended after the rendered ones (never a KV-transfer flag).",
    )
