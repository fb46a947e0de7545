"""engine_launch: the one source of an engine's arguments and environment."""

from __future__ import annotations

import json

import pytest

from prfaas_core.launch.engines import POD_IP, EngineSpec, EnvVar
from prfaas_core.launch.kinds import engine_launch


def _kv(argv: tuple[str, ...]) -> dict[str, object]:
    return json.loads(argv[argv.index("--kv-transfer-config") + 1])


@pytest.mark.parametrize(
    ("role", "kv_role"),
    [
        ("prfaas-prefill", "kv_producer"),
        ("pd-prefill", "kv_producer"),
        ("pd-decode", "kv_consumer"),
        ("pd-both", "kv_both"),
    ],
)
def test_each_role_gets_its_kv_role(role: str, kv_role: str) -> None:
    launch = engine_launch(EngineSpec(role=role, model="/m", served_model_name="m"))  # type: ignore[arg-type]
    kv = _kv(launch.argv)
    assert kv == {"kv_connector": "NixlConnector", "kv_role": kv_role, "kv_buffer_device": "cpu"}
    assert kv == launch.kv_transfer_config


def test_nixl_over_tcp_env_with_field_references() -> None:
    spec = EngineSpec(role="pd-decode", model="/m", served_model_name="m", side_channel_port=5701, net_device="eth0")
    launch = engine_launch(spec)
    env = {e.name: e for e in launch.env}
    assert env["VLLM_HOST_IP"].field_ref == POD_IP
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"].field_ref == POD_IP
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"].value == "5701"
    assert env["UCX_TLS"].value == "tcp"
    assert env["UCX_NET_DEVICES"].value == "eth0"
    resolved = launch.resolved_env({POD_IP: "10.1.2.3"})
    assert resolved["VLLM_HOST_IP"] == resolved["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.1.2.3"
    k8s = launch.to_json()["env"]
    assert {"name": "VLLM_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in k8s  # type: ignore[operator]


def test_flags_for_the_tier_and_block_size() -> None:
    spec = EngineSpec(
        role="pd-prefill",
        model="/models/tiny",
        served_model_name="tiny",
        port=8123,
        block_size=128,
        max_model_len=2048,
        enforce_eager=True,
        tensor_parallel_size=2,
    )
    argv = engine_launch(spec).argv
    assert argv[argv.index("--model") + 1] == "/models/tiny"
    assert argv[argv.index("--served-model-name") + 1] == "tiny"
    assert argv[argv.index("--port") + 1] == "8123"
    assert argv[argv.index("--block-size") + 1] == "128"
    assert argv[argv.index("--max-model-len") + 1] == "2048"
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert "--enforce-eager" in argv


def test_mooncake_over_tcp() -> None:
    launch = engine_launch(
        EngineSpec(role="prfaas-prefill", model="/m", served_model_name="m", connector="MooncakeConnector")
    )
    kv = _kv(launch.argv)
    assert kv["kv_connector"] == "MooncakeConnector"
    assert kv["kv_connector_extra_config"] == {"mooncake_protocol": "tcp"}
    names = {e.name: e.value for e in launch.env}
    assert names["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == "8998"
    assert "UCX_TLS" not in names


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"role": "pd-decode", "kv_role": "kv_producer"}, "cannot serve role 'pd-decode'"),
        ({"role": "prfaas-prefill", "kv_role": "kv_consumer"}, "cannot serve role 'prfaas-prefill'"),
        ({"role": "pd-both", "kv_role": "kv_consumer"}, "needs kv_both"),
        ({"role": "decode"}, "role must be one of"),
        ({"connector": "LMCacheConnector"}, "connector must be one of"),
        ({"block_size": 0}, "block_size"),
        ({"side_channel_port": 8000}, "side_channel_port must differ"),
        ({"port": 70000}, "port must be in"),
        ({"model": ""}, "model must be set"),
    ],
)
def test_bad_specs_name_the_field(changes: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"role": "pd-prefill", "model": "/m", "served_model_name": "m"}
    with pytest.raises(ValueError, match=message):
        engine_launch(EngineSpec(**{**base, **changes}))  # type: ignore[arg-type]


def test_extra_env_cannot_override_what_the_function_sets() -> None:
    spec = EngineSpec(role="pd-prefill", model="/m", served_model_name="m", extra_env=(EnvVar("UCX_TLS", value="rc"),))
    with pytest.raises(ValueError, match="UCX_TLS"):
        engine_launch(spec)


def test_env_var_needs_exactly_one_source() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        EnvVar("X")
    with pytest.raises(ValueError, match="no value for field reference"):
        EnvVar("X", field_ref="status.hostIP").resolve({})
