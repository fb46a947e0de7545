"""Emulator parity on the tier's engines (``benchmarks/parity.py``): the same scenario — long fresh prompts going
remote, short ones local, multi-turn sessions over a shared prefix — through our gateway and router on the tier's
real engines and on emulated engines of the same topology (1 PrFaaS, 2 PD prefill, 1 PD decode), one request at a
time; every timing-independent figure (route, KV blocks accounted and pulled, prompt tokens by source, prefix hits)
must agree. Marked ``slow`` (``scripts/test.sh --full``): a minute of requests on top of the tier's budget; the
default run checks the emulated side against the recorded real figures (``parity.py --smoke``)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from conftest import Engines
from prfaas_local.stack import EngineRef
from prfaas_local.vllm_engines import RealEnv
from support.real_engines import REPO

pytestmark = pytest.mark.slow


def _parity() -> ModuleType:
    spec = importlib.util.spec_from_file_location("benchmarks_parity", REPO / "benchmarks" / "parity.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_emulator_matches_vllm_on_routes_bytes_and_prefix_hits(
    engines: Engines, real_env: RealEnv, tmp_path: Path
) -> None:
    parity = _parity()
    steps = parity.scenario(seed=11)  # not the smoke mode's prompts: the tier's engines may have cached those
    pd = [EngineRef(e.name, e.url) for e in engines.pd_prefill]
    real = parity.real_rows(
        tmp_path, real_env, EngineRef("prfaas", engines.prfaas.url), pd, EngineRef("pdd", engines.pdd.url), steps
    )
    emulated = parity.emulated_rows(tmp_path / "emulated", len(pd), steps)
    result = parity.report(emulated, real, "real")
    print(json.dumps(result["totals"], indent=2))
    assert result["differ"] == [], result["differ"]
    assert set(result["totals"]["real"]["routes"]) == {"remote", "local"}
