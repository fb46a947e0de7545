"""Engine configuration from the custom resources: a PrefillCluster or PDCluster (its ``kvTransport``,
``engine``, hardware, role-assignment mode) and its ModelProfile become one :class:`EngineSpec` per role, and
so, through the one engine-flag function :func:`~prfaas_core.launch.engines.engine_launch`, the container ``command``,
``args`` and ``env`` of every engine the cluster runs. Pure: no I/O.

Roles: a PrefillCluster's instances are ``prfaas-prefill`` (``kv_producer``); a PDCluster in Relabel mode runs
one workload of ``pd-both`` instances (``kv_both``: a role flip is a relabel, not a restart); in Scale mode its
prefill workload is ``pd-prefill`` (``kv_producer``) and its decode workload ``pd-decode`` (``kv_consumer``).

Used by ``prfaas engines`` (``-o json``/``-o helm-values``), ``prfaas validate`` and the operator's
``EngineConfig`` condition, which compares what the running pods were started with against what this renders.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..api.model_profile import ModelProfile
from ..api.pd_cluster import PDCluster
from ..api.prefill_cluster import PrefillCluster
from .engines import DEFAULT_KV_ROLE, EngineLaunch, EngineRole, EngineSpec, KvRole
from .kinds import engine_launch

Cluster = PrefillCluster | PDCluster

OWN_FLAGS: tuple[str, ...] = (
    "--model",
    "--served-model-name",
    "--host",
    "--port",
    "--kv-transfer-config",
    "--block-size",
    "--tensor-parallel-size",
    "--max-model-len",
)
"""Flags the renderer sets itself; ``spec.engine.extraArgs`` may not set them again."""


class RenderError(ValueError):
    """A resource that cannot give a working engine: ``field`` is the path in the object, ``reason`` why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def cluster_roles(cluster: Cluster) -> tuple[EngineRole, ...]:
    """The engine roles a cluster's workloads run."""
    if isinstance(cluster, PrefillCluster):
        return ("prfaas-prefill",)
    if cluster.spec.role_assignment.mode == "Relabel":
        return ("pd-both",)
    return ("pd-prefill", "pd-decode")


def _kv_role(cluster: Cluster, role: EngineRole) -> KvRole:
    wanted = cluster.spec.kv_transport.kv_role
    default = DEFAULT_KV_ROLE[role]
    if wanted is None or wanted == default:
        return default
    if isinstance(cluster, PrefillCluster):
        raise RenderError(
            "spec.kvTransport.kvRole",
            f"{wanted} cannot serve a PrFaaS prefill instance: it only produces KV (kv_producer)",
        )
    if cluster.spec.role_assignment.mode == "Relabel":
        raise RenderError(
            "spec.kvTransport.kvRole",
            f"{wanted} does not fit roleAssignment.mode Relabel: its instances flip between prefill and decode "
            "without a restart, so each must both produce and consume KV (kv_both)",
        )
    if wanted != "kv_both":
        raise RenderError(
            "spec.kvTransport.kvRole",
            f"{wanted} does not fit roleAssignment.mode Scale: its prefill workload produces (kv_producer) and "
            "its decode workload consumes (kv_consumer); leave kvRole unset (or kv_both for both)",
        )
    return wanted


def _served_name(profile: ModelProfile | None) -> str:
    if profile is None:
        raise RenderError("spec.modelProfileRef.name", "the ModelProfile is not among the given objects")
    if not profile.spec.served_model_name:
        raise RenderError(
            f"ModelProfile {profile.metadata.name}: spec.servedModelName",
            "required to render engines (the name clients send and the router checks)",
        )
    return profile.spec.served_model_name


HYBRID_DTYPES: Mapping[str, str] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
"""A hybrid's engines run in its profile's ``kvDtype`` (vLLM's CPU kernels for gated DeltaNet need bf16)."""


def hybrid_fields(profile: ModelProfile | None) -> dict[str, Any]:
    """The EngineSpec fields a hybrid model's profile implies: its linear kind (the launch adds the state
    transfer's environment), its dtype, and prefix caching off for Mamba2 (vLLM 0.32 fails with it on)."""
    arch = profile.spec.architecture if profile is not None else None
    if arch is None or arch.linear_kind is None:
        return {}
    return {
        "linear_kind": arch.linear_kind,
        "dtype": HYBRID_DTYPES.get(arch.kv_dtype),
        "prefix_caching": False if arch.linear_kind == "Mamba2" else None,
    }


def engine_specs(cluster: Cluster, profile: ModelProfile | None) -> dict[EngineRole, EngineSpec]:
    """One EngineSpec per role of ``cluster`` (RenderError names the field that stops it)."""
    spec = cluster.spec
    transport = spec.kv_transport
    engine = spec.engine
    served = _served_name(profile)
    for i, arg in enumerate(engine.extra_args):
        flag = arg.split("=", 1)[0]
        if flag in OWN_FLAGS or flag.startswith("--kv-"):
            raise RenderError(f"spec.engine.extraArgs[{i}]", f"{flag} is rendered from the resource; set its field")
    side_channel = engine.side_channel_port or transport.side_channel_port
    if side_channel is not None and side_channel == engine.port:
        where = "spec.engine.sideChannelPort" if engine.side_channel_port else "spec.kvTransport.sideChannelPort"
        raise RenderError(
            where,
            f"{side_channel} is also the engine's HTTP port (spec.engine.port); one pod cannot listen twice on it",
        )
    out: dict[EngineRole, EngineSpec] = {}
    for role in cluster_roles(cluster):
        kv_role = _kv_role(cluster, role)
        es = EngineSpec(
            role=role,
            model=engine.model or served,
            served_model_name=served,
            connector=transport.connector,
            kv_role=kv_role,
            block_size=engine.block_size,
            tensor_parallel_size=engine.tensor_parallel_size or spec.hardware.gpus_per_instance,
            port=engine.port,
            side_channel_port=side_channel,
            net_device=transport.net_device,
            kv_buffer_device=transport.buffer_device,
            transport=transport.protocol,
            ucx_tcp_port_range=(transport.data_ports.start, transport.data_ports.end) if transport.data_ports else None,
            max_model_len=engine.max_model_len,
            enforce_eager=engine.enforce_eager,
            kv_events_port=engine.kv_events_port,
            extra_args=tuple(engine.extra_args),
            **hybrid_fields(profile),
        )
        try:
            engine_launch(es)
        except ValueError as exc:
            raise RenderError("spec.engine", str(exc)) from None
        out[role] = es
    return out


def cluster_launches(cluster: Cluster, profile: ModelProfile | None) -> dict[EngineRole, EngineLaunch]:
    """What every role of ``cluster`` starts with."""
    return {role: engine_launch(es) for role, es in engine_specs(cluster, profile).items()}


def runs_engines_here(cluster: Cluster) -> bool:
    """A Remote PrefillCluster describes engines another region runs: nothing to render for it here."""
    return not (isinstance(cluster, PrefillCluster) and cluster.spec.mode == "Remote")


def render_all(
    clusters: Sequence[Cluster], profiles: Mapping[str, ModelProfile]
) -> dict[str, dict[str, dict[str, object]]]:
    """``{cluster: {role: EngineLaunch.to_json()}}`` for every cluster that runs engines (``prfaas engines -o
    json``). RenderError names the cluster and the field."""
    out: dict[str, dict[str, dict[str, object]]] = {}
    for cluster in clusters:
        if not runs_engines_here(cluster):
            continue
        name = cluster.metadata.name
        if name in out:
            raise RenderError(f"{cluster.kind}/{name}: metadata.name", "another cluster of that name renders too")
        try:
            launches = cluster_launches(cluster, profiles.get(cluster.spec.model_profile_ref.name))
        except RenderError as exc:
            raise RenderError(f"{cluster.kind}/{name}: {exc.field}", exc.reason) from None
        out[name] = {role: launch.to_json() for role, launch in launches.items()}
    return out


# --- comparing a running pod with what the resources imply (the operator's EngineConfig condition) ---


@dataclass(frozen=True)
class LaunchDiff:
    """One difference between a pod's engine container and the rendered launch."""

    what: str
    """The differing flag (``--kv-transfer-config``) or variable (``env UCX_TLS``)."""
    expected: str | None
    actual: str | None

    def __str__(self) -> str:
        return f"{self.what}: expected {self.expected!r}, running {self.actual!r}"


def _flags(argv: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            if "=" in arg:
                key, value = arg.split("=", 1)
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                key, value = arg, argv[i + 1]
                i += 1
            else:
                key, value = arg, ""
            out[key] = value
        i += 1
    return out


def _env_text(entry: Mapping[str, Any]) -> str:
    if "value" in entry:
        return str(entry["value"])
    ref = ((entry.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
    return f"fieldRef:{ref}"


def launch_diff(launch: EngineLaunch, container: Mapping[str, Any]) -> list[LaunchDiff]:
    """How a container spec (``command``/``args``/``env`` as the API server holds them) differs from ``launch``:
    every flag of the rendered args with another value or missing, and every rendered variable."""
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    running = _flags([str(a) for a in argv])
    diffs = [
        LaunchDiff(flag, value, running.get(flag))
        for flag, value in _flags(launch.argv).items()
        if running.get(flag) != value
    ]
    env = {str(e.get("name")): _env_text(e) for e in container.get("env") or [] if isinstance(e, Mapping)}
    for var in launch.env:
        want = _env_text(var.to_k8s())
        if env.get(var.name) != want:
            diffs.append(LaunchDiff(f"env {var.name}", want, env.get(var.name)))
    return diffs


__all__ = [
    "OWN_FLAGS",
    "LaunchDiff",
    "RenderError",
    "cluster_launches",
    "cluster_roles",
    "engine_specs",
    "hybrid_fields",
    "launch_diff",
    "render_all",
    "runs_engines_here",
]
