"""The engine seam: everything that changes with the engine kind is in the core's launch package, one module per
kind behind one registry; nothing else names vLLM's wire details but the listed, justified exceptions."""

from __future__ import annotations

import re
import subprocess
import typing
from pathlib import Path

import pytest

from prfaas_core.api.common import KvTransportSpec
from prfaas_core.launch import vllm
from prfaas_core.launch.engines import CONNECTORS, EngineKind
from prfaas_core.launch.kinds import ENGINE_KINDS, EngineKindModule, engine_kind

REPO = Path(__file__).resolve().parents[2]
WIRE = re.compile(r"kv_transfer_params|do_remote_decode|do_remote_prefill|vllm:[a-z_]")

ALLOWED = (
    "scheduler/prfaas_core/launch/",  # the seam itself
    "scheduler/prfaas_engine/",  # the engine emulator speaks vLLM's protocol
    "tests/",  # tests check the wire
)
EXCEPTIONS = {
    "scheduler/prfaas_core/names.py": "the one list of metric names (vLLM's too; launch/vllm.py's METRICS reads them)",
    "scripts/build_dashboard.py": "PromQL of the dashboard: it names vLLM's series (checked against names.py)",
    "scripts/build_alerts.py": "PromQL of the alert rules: it names vLLM's series (checked on real engines)",
    "benchmarks/router_overhead.py": "a stand-in engine speaking vLLM's protocol, like the emulator",
    "benchmarks/parity.py": "the real-vs-emulator parity benchmark describes the series it compares",
}
"""Code outside the seam that names vLLM's wire, and why (docs/ARCHITECTURE.md lists them too). Data and prose
(the dashboard JSON, the alert rules, Markdown, the examples' YAML comments) name the series they query or
describe and are not code: only Python files are checked."""


def _python_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True)
        return out.stdout.split()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every Python file of the tree
        skip = (".venv", "build", ".git")
        return [str(p.relative_to(REPO)) for p in REPO.rglob("*.py") if p.parts[len(REPO.parts)] not in skip]


def test_nothing_outside_the_seam_names_vllms_wire() -> None:
    files = _python_files()
    assert "scheduler/prfaas_router/state/wire.py" in files  # the walk sees the tree
    found = sorted(
        f
        for f in files
        if not f.startswith(ALLOWED) and f not in EXCEPTIONS and WIRE.search((REPO / f).read_text(errors="replace"))
    )
    assert found == [], f"vLLM's wire named outside prfaas_core/launch: {found} (go through launch.kinds.engine_kind)"
    stale = [f for f in EXCEPTIONS if not WIRE.search((REPO / f).read_text(errors="replace"))]
    assert stale == [], f"exceptions that no longer need listing: {stale}"


def test_every_engine_kind_is_registered_with_the_whole_interface() -> None:
    assert set(ENGINE_KINDS) == set(typing.get_args(EngineKind))
    members = [m for m in EngineKindModule.__dict__ if not m.startswith("_")]
    members += list(EngineKindModule.__annotations__)
    for kind, module in ENGINE_KINDS.items():
        assert engine_kind(kind) is module and kind == module.KIND
        missing = [m for m in members if not hasattr(module, m)]
        assert missing == [], f"{kind} lacks {missing}"
    with pytest.raises(ValueError, match="engine kind must be one of vllm"):
        engine_kind("sglang")  # type: ignore[arg-type]


def test_the_api_lists_only_connectors_the_launch_code_renders() -> None:
    listed = set(typing.get_args(KvTransportSpec.model_fields["connector"].annotation))
    assert listed == set(CONNECTORS)
    with pytest.raises(ValueError, match="connector"):
        KvTransportSpec.model_validate({"connector": "SGLangMooncake"})


def test_vllm_legs_round_trip_a_handle() -> None:
    body = {"model": "m", "prompt": "p", "max_tokens": 64, "stream": True, "stream_options": {"x": 1}}
    leg = vllm.prefill_body(body)
    assert leg["max_tokens"] == 1 and leg["stream"] is False and "stream_options" not in leg
    assert vllm.is_prefill_leg(leg) and not vllm.is_prefill_leg(body)
    assert vllm.refused_handle_field(leg) is None
    assert "evil" in str(vllm.refused_handle_field({vllm.KV_HANDLE_FIELD: {"evil": 1}}))
    handle = {"do_remote_prefill": True, "remote_host": "10.0.0.1", "remote_port": 5600}
    assert vllm.kv_handle({vllm.KV_HANDLE_FIELD: handle}) == handle
    assert vllm.kv_handle({"choices": []}) is None
    decode = vllm.decode_body(body, handle)
    assert decode[vllm.KV_HANDLE_FIELD] == handle and decode["max_tokens"] == 64
    assert vllm.KV_HANDLE_FIELD not in vllm.decode_body({**body, vllm.KV_HANDLE_FIELD: {}}, None)
    release = vllm.release_body(handle)
    assert release["model"] == vllm.RELEASE_MODEL and release[vllm.KV_HANDLE_FIELD] == handle
    with pytest.raises(ValueError, match="must be an object"):
        vllm.check_body({vllm.KV_HANDLE_FIELD: "yes"})
    assert vllm.runs_in({"command": ["python3", "-m", "vllm.entrypoints.openai.api_server"]})
    assert not vllm.runs_in({"command": ["prfaas", "engine"], "image": "prfaas:dev"})
