"""The kind-neutral description of an engine instance (:class:`EngineSpec`: its role, model, KV connector,
addresses) and what starts it (:class:`EngineLaunch`), rendered by its kind's module through :func:`engine_launch`.

Every part that starts or describes a real engine goes through :func:`engine_launch`: the real-engine test
harness (``tests/real``), the local stack on real engines, and the rendering of engine workloads from the custom
resources. Nothing else writes an engine's flags or its transport's variables. Each engine kind is one module of
this package (:mod:`.vllm`), registered in :mod:`.kinds`.

Roles: a PrFaaS instance only produces KV (``kv_producer``); a PD prefill instance produces, a PD decode
instance consumes (``kv_consumer``); an instance whose role flips (the Relabel mode) does both (``kv_both``).

Addresses are :class:`EnvVar` field references (``status.podIP``) that Kubernetes resolves in the pod; the test
harness resolves them to 127.0.0.1 or to a network namespace's address (:meth:`EngineLaunch.resolved_env`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

EngineKind = Literal["vllm"]
EngineRole = Literal["prfaas-prefill", "pd-prefill", "pd-decode", "pd-both"]
Connector = Literal["NixlConnector", "MooncakeConnector"]
KvRole = Literal["kv_producer", "kv_consumer", "kv_both"]
KvBufferDevice = Literal["cpu", "cuda"]
LinearKind = Literal["GatedDeltaNet", "Mamba2", "KDA"]
"""A hybrid model's recurrent layer (the ModelProfile's ``architecture.linearKind``)."""

ENGINE_ROLES: tuple[EngineRole, ...] = ("prfaas-prefill", "pd-prefill", "pd-decode", "pd-both")
CONNECTORS: tuple[Connector, ...] = ("NixlConnector", "MooncakeConnector")

POD_IP: str = "status.podIP"
"""The field reference an engine's own address resolves from (Kubernetes' downward API)."""

DEFAULT_KV_ROLE: Mapping[EngineRole, KvRole] = {
    "prfaas-prefill": "kv_producer",
    "pd-prefill": "kv_producer",
    "pd-decode": "kv_consumer",
    "pd-both": "kv_both",
}
ALLOWED_KV_ROLES: Mapping[EngineRole, frozenset[KvRole]] = {
    "prfaas-prefill": frozenset({"kv_producer", "kv_both"}),
    "pd-prefill": frozenset({"kv_producer", "kv_both"}),
    "pd-decode": frozenset({"kv_consumer", "kv_both"}),
    "pd-both": frozenset({"kv_both"}),
}
"""A PrFaaS or PD prefill instance must produce KV, a decode instance must consume it; ``kv_both`` does both."""


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: a literal ``value`` or a ``field_ref`` resolved where the engine runs."""

    name: str
    value: str | None = None
    field_ref: str | None = None

    def __post_init__(self) -> None:
        if (self.value is None) == (self.field_ref is None):
            raise ValueError(f"env {self.name}: set exactly one of value or field_ref")

    def resolve(self, fields: Mapping[str, str]) -> str:
        if self.value is not None:
            return self.value
        assert self.field_ref is not None
        try:
            return fields[self.field_ref]
        except KeyError:
            raise ValueError(f"env {self.name}: no value for field reference {self.field_ref!r}") from None

    def to_k8s(self) -> dict[str, object]:
        """The container ``env`` entry (``valueFrom.fieldRef`` for a field reference)."""
        if self.value is not None:
            return {"name": self.name, "value": self.value}
        return {"name": self.name, "valueFrom": {"fieldRef": {"fieldPath": self.field_ref}}}


@dataclass(frozen=True)
class EngineSpec:
    """What :func:`engine_launch` needs to start one engine instance."""

    role: EngineRole
    model: str
    """Model path (or hub name where a hub is reachable)."""
    served_model_name: str
    """The name clients send (``model`` in the OpenAI body); the router checks it."""
    kind: EngineKind = "vllm"
    connector: Connector = "NixlConnector"
    kv_role: KvRole | None = None
    """None: the role's default (:data:`DEFAULT_KV_ROLE`)."""
    block_size: int | None = None
    """KV block size in tokens, the same number as RouterConfig's ``prefixBlockTokens`` (CPU vLLM: 128;
    GPU vLLM: 16 by default). None: the engine's default."""
    tensor_parallel_size: int = 1
    port: int = 8000
    host: str = "0.0.0.0"
    """The HTTP listener's bind address."""
    side_channel_port: int | None = None
    """NIXL side-channel port (distinct per instance on one host), or Mooncake's bootstrap port. None: the
    connector's default."""
    host_ip: str | None = None
    """The address the engine advertises for KV pulls and binds its side channel to. None: the pod's IP
    (a field reference)."""
    net_device: str | None = None
    """UCX's network device (``UCX_NET_DEVICES``, e.g. ``eth0``, ``lo``, a namespace's veth). None: UCX picks."""
    kv_buffer_device: KvBufferDevice = "cpu"
    """Where the connector stages KV: ``cpu`` for the CPU build; ``cuda`` on GPUs."""
    transport: Literal["tcp", "rdma"] = "tcp"
    """tcp across datacenters (ordinary Ethernet); rdma inside one fabric."""
    ucx_tcp_port_range: tuple[int, int] | None = None
    """NIXL over TCP: the ports UCX's TCP transport listens on for KV data (``UCX_TCP_PORT_RANGE``), so that a
    NetworkPolicy or firewall can admit them. None: ephemeral ports the OS picks."""
    max_model_len: int | None = None
    enforce_eager: bool = False
    """Skip graph capture / torch.compile (the CPU build's first start is 2-3x faster with it)."""
    linear_kind: LinearKind | None = None
    """A hybrid model's recurrent layer (from the ModelProfile): the engine then gets the flags and environment
    its state transfer needs (:func:`prfaas_core.launch.vllm.launch`). None: a pure attention model."""
    dtype: str | None = None
    """The model's weights and activations dtype (``--dtype``); None: the engine's default (the checkpoint's)."""
    prefix_caching: bool | None = None
    """Whether the engine caches prefixes; None: the engine's default (on). A Mamba2 hybrid needs it off."""
    kv_events_port: int | None = None
    """The port the engine publishes its KV cache events on (vLLM's ZMQ publisher, ``--kv-events-config``), which
    the routers subscribe to for their exact prefix index; None: no events (the routers learn from routing)."""
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[EnvVar, ...] = ()


@dataclass(frozen=True)
class EngineLaunch:
    """A container's ``command``, ``args`` and ``env`` for one engine instance."""

    command: tuple[str, ...]
    argv: tuple[str, ...]
    env: tuple[EnvVar, ...]
    kv_transfer_config: dict[str, object] = field(default_factory=dict)
    """The parsed ``--kv-transfer-config`` (the same JSON as in ``argv``), for checks and reports."""

    def resolved_env(self, fields: Mapping[str, str]) -> dict[str, str]:
        """The environment with field references resolved (e.g. ``{POD_IP: "127.0.0.1"}``)."""
        return {e.name: e.resolve(fields) for e in self.env}

    def to_json(self) -> dict[str, object]:
        return {
            "command": list(self.command),
            "args": list(self.argv),
            "env": [e.to_k8s() for e in self.env],
            "kvTransferConfig": self.kv_transfer_config,
        }


def check_spec(spec: EngineSpec) -> KvRole:
    if spec.role not in ENGINE_ROLES:
        raise ValueError(f"role must be one of {', '.join(ENGINE_ROLES)}, got {spec.role!r}")
    if spec.connector not in CONNECTORS:
        raise ValueError(f"connector must be one of {', '.join(CONNECTORS)}, got {spec.connector!r}")
    kv_role = spec.kv_role or DEFAULT_KV_ROLE[spec.role]
    if kv_role not in ALLOWED_KV_ROLES[spec.role]:
        allowed = " or ".join(sorted(ALLOWED_KV_ROLES[spec.role]))
        raise ValueError(f"kv_role {kv_role!r} cannot serve role {spec.role!r} (needs {allowed})")
    if not spec.model:
        raise ValueError("model must be set")
    if not spec.served_model_name:
        raise ValueError("served_model_name must be set")
    if spec.block_size is not None and not 1 <= spec.block_size <= 4096:
        raise ValueError(f"block_size must be in [1, 4096], got {spec.block_size}")
    if spec.tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {spec.tensor_parallel_size}")
    for name, port in (("port", spec.port), ("side_channel_port", spec.side_channel_port)):
        if port is not None and not 1 <= port <= 65_535:
            raise ValueError(f"{name} must be in [1, 65535], got {port}")
    if spec.side_channel_port is not None and spec.side_channel_port == spec.port:
        raise ValueError("side_channel_port must differ from the HTTP port")
    if spec.ucx_tcp_port_range is not None:
        low, high = spec.ucx_tcp_port_range
        if not 1 <= low <= high <= 65_535:
            raise ValueError(f"ucx_tcp_port_range must be 1 <= start <= end <= 65535, got {low}-{high}")
        for name, port in (("port", spec.port), ("side_channel_port", spec.side_channel_port)):
            if port is not None and low <= port <= high:
                raise ValueError(f"ucx_tcp_port_range {low}-{high} holds the {name} {port}")
    if spec.max_model_len is not None and spec.max_model_len < 1:
        raise ValueError(f"max_model_len must be >= 1, got {spec.max_model_len}")
    if spec.linear_kind == "Mamba2" and spec.prefix_caching is not False:
        raise ValueError(
            "prefix_caching must be off for a Mamba2 hybrid: vLLM 0.32 fails on its first prefill with prefix "
            "caching on (IndexError in mamba_mixer2)"
        )
    return kv_role
