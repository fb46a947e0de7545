"""The real-engine two-region example (examples/04-real-engines: NIXL over TCP, TP 1) runs in miniature: the
tier's engines are started from what ``prfaas engines`` renders for it, with only the model's path, the ports and
this host's address and interface substituted, and they exchange KV with those flags."""

from __future__ import annotations

import json

import httpx

from conftest import Engines, counters, delta
from prfaas_cli.engines_cmd import render_files
from prfaas_core.launch.vllm import PREFILL_KV_PARAMS
from prfaas_local.vllm_engines import EXAMPLE, Prompts, RealEngine, RealEnv

SUBSTITUTED_FLAGS = {"--model", "--port", "--host"}
SUBSTITUTED_ENV = {"VLLM_NIXL_SIDE_CHANNEL_PORT", "UCX_NET_DEVICES"}


def _flag_pairs(args: list[str]) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
            out.append((arg, nxt))
    return out


def _check_runs_rendered(engine: RealEngine, rendered: dict[str, object], env: RealEnv) -> None:
    running = engine.launch.to_json()
    assert running["command"] == rendered["command"]
    assert running["kvTransferConfig"] == rendered["kvTransferConfig"]
    ours = _flag_pairs(list(running["args"]))  # type: ignore[call-overload]
    theirs = _flag_pairs(list(rendered["args"]))  # type: ignore[call-overload]
    assert [f for f, _ in ours] == [f for f, _ in theirs]  # the same flags, in the same order
    for (flag, value), (_, want) in zip(ours, theirs, strict=True):
        if flag not in SUBSTITUTED_FLAGS:
            assert value == want, f"{engine.name}: {flag} is {value!r}, the example renders {want!r}"
    assert dict(ours)["--model"] == env.model
    assert dict(ours)["--port"] == str(engine.spec.port)
    run_env = {e["name"]: e for e in running["env"]}  # type: ignore[attr-defined]
    want_env = {e["name"]: e for e in rendered["env"]}  # type: ignore[attr-defined]
    assert set(run_env) == set(want_env)
    for name, entry in want_env.items():
        if name not in SUBSTITUTED_ENV:
            assert run_env[name] == entry, f"{engine.name}: env {name}"


def test_tier_engines_run_the_flags_the_example_renders(engines: Engines, real_env: RealEnv) -> None:
    rendered = render_files([str(EXAMPLE)])
    _check_runs_rendered(engines.prfaas, rendered["prfaas-cpu"]["prfaas-prefill"], real_env)
    for e in engines.pd_prefill:
        _check_runs_rendered(e, rendered["pd-cpu"]["pd-prefill"], real_env)
    _check_runs_rendered(engines.pdd, rendered["pd-cpu"]["pd-decode"], real_env)
    kv = json.loads(engines.pdd.launch.argv[engines.pdd.launch.argv.index("--kv-transfer-config") + 1])
    assert kv == {"kv_buffer_device": "cpu", "kv_connector": "NixlConnector", "kv_role": "kv_consumer"}


def test_rendered_engines_move_kv_from_prfaas_to_decode(engines: Engines, prompts: Prompts, real_env: RealEnv) -> None:
    """A P/D exchange by hand between the example's PrFaaS engine and its decode engine: the decode pulls every
    prompt token over NIXL (none recomputed: the connector is really configured)."""
    prompt = prompts.text(600)
    body = {"model": real_env.served_model_name, "prompt": prompt, "max_tokens": 4, "temperature": 0}
    before = counters(engines)
    r = httpx.post(
        f"{engines.prfaas.url}/v1/completions",
        json={**body, "max_tokens": 1, "stream": False, "kv_transfer_params": dict(PREFILL_KV_PARAMS)},
        timeout=120,
    )
    r.raise_for_status()
    n = r.json()["usage"]["prompt_tokens"]
    r = httpx.post(
        f"{engines.pdd.url}/v1/completions",
        json={**body, "kv_transfer_params": r.json()["kv_transfer_params"]},
        timeout=120,
    )
    r.raise_for_status()
    after = counters(engines)
    assert delta(before, after, "prfaas", "local_compute") == n
    # the last prompt token is recomputed by the decode side (vLLM pulls the full blocks and the rest)
    assert delta(before, after, "pdd", "external_kv_transfer") + delta(before, after, "pdd", "local_compute") == n
    assert delta(before, after, "pdd", "external_kv_transfer") >= n - 1
