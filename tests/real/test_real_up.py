"""``prfaas up --engines vllm`` briefly, on the tier's engine pool: 1 PrFaaS + 2 PD real engines, the router, the
gateway and the long-term loop live; the PD prefill count pinned to 0, so the loop drains ``pd-0`` (the router stops
sending it work, the loop waits for vLLM's own in-flight gauges to reach 0) and flips it to decode by relabelling.

Runs right after the namespace module and before the tier's loopback set (conftest orders it), with its three
engines (~7.8 GiB) ended when it returns. Marked ``slow`` (``scripts/test.sh --full``): three more engines and
half a minute of traffic (~2.5 min on 2 busy cores) do not fit the default tier's budget."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from prfaas_cli.main import build_parser
from prfaas_local import real_up
from prfaas_local.vllm_engines import EnginePool, Prompts, RealEnginesUnavailable, RealEnv
from support.real_engines import skip_or_fail

pytestmark = pytest.mark.slow


def test_up_on_real_engines_serves_every_request_and_flips_by_relabel(vllm_pool: EnginePool, tmp_path: Path) -> None:
    argv = ["up", "--engines", "vllm", "--duration", "25", "--pin-prefill", "0", "--work-dir", str(tmp_path)]
    args = build_parser().parse_args([*argv, "-o", "json"])
    rc = real_up.run(args, pool=vllm_pool)
    out = json.loads((tmp_path / "summary.json").read_text())
    print("\n" + json.dumps({k: out[k] for k in ("requests", "link", "loop", "final_roles", "wall_seconds")}))
    assert rc == 0, out["errors"]
    assert out["requests"]["requests"] > 0 and out["requests"]["ok"] == out["requests"]["requests"]
    assert "remote" in out["by_route"], out["by_route"]
    assert out["link"]["router_remote_kv_bytes"] > 0
    # the pinned split reached by a drain and a relabel: pd-0 decodes, by the router's own config
    assert [f["action"] for f in out["role_flips"]] == ["FlipToDecode"], out["role_flips"]
    assert out["final_roles"] == {"prefill": 0, "decode": 2}
    published = json.loads((tmp_path / "router.json").read_text())
    # decode instances are labelled "both" (kv_both: they prefill in place while no PD prefill instance can)
    assert {e["name"]: e["role"] for e in published["endpoints"]} == {"pd-0": "both", "pd-1": "both"}
    assert published.get("draining", []) == []
    assert not vllm_pool.engines, "the run left engines behind"


def test_up_on_the_hybrid_model_runs_its_phases(real_env: RealEnv, tmp_path: Path) -> None:
    """``prfaas up --engines vllm --model hybrid``: the same run on the tiny Qwen3-Next (its engines' flags and the
    routers' profile from ``prfaas profile``): every request served, remote ones among them, the pinned split
    reached by a drain and a relabel."""
    try:
        env = real_env.hybrid()
    except RealEnginesUnavailable as exc:
        skip_or_fail(str(exc))
        raise
    pool = EnginePool(env, tmp_path / "logs")
    argv = ["up", "--engines", "vllm", "--model", "hybrid", "--duration", "25", "--pin-prefill", "0"]
    try:
        rc = real_up.run(build_parser().parse_args([*argv, "--work-dir", str(tmp_path), "-o", "json"]), pool=pool)
    finally:
        pool.close()
    out = json.loads((tmp_path / "summary.json").read_text())
    print("\n" + json.dumps({k: out[k] for k in ("requests", "by_route", "link", "final_roles", "wall_seconds")}))
    assert rc == 0, out["errors"]
    assert out["requests"]["requests"] > 0 and out["requests"]["ok"] == out["requests"]["requests"]
    assert "remote" in out["by_route"], out["by_route"]
    assert out["link"]["router_remote_kv_bytes"] > 0
    assert [f["action"] for f in out["role_flips"]] == ["FlipToDecode"], out["role_flips"]
    assert out["final_roles"] == {"prefill": 0, "decode": 2}
    published = json.loads((tmp_path / "router.json").read_text())
    assert published["model"]["architecture"]["linearKind"] == "GatedDeltaNet"
    assert published["routing"]["prefixBlockTokens"] == published["model"]["architecture"]["blockTokens"] == 256
    assert "Setting attention block size to 256 tokens" in (tmp_path / "logs" / "pd-1.log").read_text()


def test_up_on_real_engines_serves_your_own_openai_client_until_sigterm(tmp_path: Path, prompts: Prompts) -> None:
    """``prfaas up --engines vllm --serve``: no built-in load; the openai SDK from outside gets a short (local) and a
    long (remote) answer through the router; SIGTERM stops the stack and the summary counts both."""
    work = tmp_path / "serve"
    argv = [sys.executable, "-m", "prfaas_cli.main", "up", "--engines", "vllm", "--serve", "--work-dir", str(work)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 600  # bounds a hang only: three engines start in 2-4 minutes here
        while not (work / "endpoints.json").exists():
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no endpoints.json"
            time.sleep(1)
        info = json.loads((work / "endpoints.json").read_text())
        t = json.loads((work / "router.json").read_text())["thresholdMinTokens"]
        assert t < 1800, t  # the planner's t for the tiny model's lengths leaves room for a remote prompt
        with openai.OpenAI(base_url=info["openai_base_url"], api_key="none", max_retries=0, timeout=180) as client:
            routes = []
            for tokens in (150, t + 200):
                raw = client.completions.with_raw_response.create(
                    model=info["model"], prompt=prompts.text(tokens), max_tokens=8, temperature=0
                )
                assert raw.parse().usage is not None
                routes.append(raw.headers["x-prfaas-route"])
        assert routes[0] == "local" and routes[1] in ("remote", "fallback"), routes
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    out = json.loads((work / "summary.json").read_text())
    assert out["router_requests_total"] >= 2, out
