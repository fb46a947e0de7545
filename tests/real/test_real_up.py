"""``prfaas up --engines vllm`` briefly, on the tier's engine pool: 1 PrFaaS + 2 PD real engines, the router, the
gateway and the long-term loop live; the PD prefill count pinned to 0, so the loop drains ``pd-0`` (the router stops
sending it work, the loop waits for vLLM's own in-flight gauges to reach 0) and flips it to decode by relabelling.

Runs right after the namespace module and before the tier's loopback set (conftest orders it), with its three
engines (~7.8 GiB) ended when it returns. Marked ``slow`` (``scripts/test.sh --full``): three more engines and
half a minute of traffic (~2.5 min on 2 busy cores) do not fit the default tier's budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prfaas_cli import real_up
from prfaas_cli.main import build_parser
from prfaas_cli.vllm_engines import EnginePool

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
