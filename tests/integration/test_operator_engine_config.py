"""The operator's EngineConfig condition: running engine pods compared with what the resources imply (rendered
through engine_launch), naming the pod and the differing flag."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prfaas_cli.engines_cmd import render_files
from prfaas_operator.router_config import configmap_name
from prfaas_testbed.operator_harness import Harness
from prfaas_testbed.prom import wait_until

REPO = Path(__file__).resolve().parents[2]


def _container(launch: dict[str, Any], port: int) -> dict[str, Any]:
    return {
        "name": "engine",
        "image": "vllm/vllm-openai:v0.32.0",
        "command": launch["command"],
        "args": launch["args"],
        "env": launch["env"],
        "ports": [{"name": "http", "containerPort": port}],
    }


def test_engine_config_condition_names_the_pod_and_the_flag(h: Harness) -> None:
    ns = h.namespace()
    op = h.start_operator(ns)
    h.setup(ns)
    h.ready_roles(ns, 3, 5, 30)
    # the testbed's pods run emulators, not vLLM: nothing to judge
    wait_until(lambda: h.condition(ns, "EngineConfig").get("reason") == "NoVllmEngines", 30, "Unknown first")
    launch = render_files([str(REPO / "examples/01-two-region")])["pd-h20"]["pd-both"]
    h.patch("Pod", ns, "pd-engines-0", {"spec": {"containers": [_container(launch, 8000)]}})
    wait_until(lambda: h.condition(ns, "EngineConfig").get("status") == "True", 30, "the rendered pod matches")
    assert h.condition(ns, "EngineConfig")["reason"] == "Matches"
    # an engine started with another KV role (and without UCX's TCP setting): the condition says which and where
    wrong = json.loads(json.dumps(launch))
    i = wrong["args"].index("--kv-transfer-config")
    kv = json.loads(wrong["args"][i + 1])
    wrong["args"][i + 1] = json.dumps({**kv, "kv_role": "kv_producer"}, separators=(",", ":"), sort_keys=True)
    h.patch("Pod", ns, "pd-engines-1", {"spec": {"containers": [_container(wrong, 8001)]}})
    wait_until(lambda: h.condition(ns, "EngineConfig").get("status") == "False", 30, "the differing pod is reported")
    cond = h.condition(ns, "EngineConfig")
    assert cond["reason"] == "EngineFlagsDiffer"
    assert "pod pd-engines-1 (pd-both): --kv-transfer-config" in cond["message"]
    assert "kv_producer" in cond["message"]
    assert "pd-engines-0" not in cond["message"]
    # the operator copies the PDCluster's SLO into the routers' configuration (RouterConfig.slo)
    cm = h.get("ConfigMap", ns, configmap_name("pd-h20"))
    assert cm is not None
    config = json.loads(next(iter(cm["data"].values())))
    assert config["slo"]["ttft"] == {"baseSeconds": 2.0, "secondsPerKTokens": 0.2}
    op.stop()
