"""The real-engine benchmark's smoke mode on the tier's engines (so the script cannot rot unseen)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import Engines
from support.real_engines import REPO


def test_real_engine_benchmark_smoke(engines: Engines) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "real_engines.py"),
            "--smoke",
            "--prefill-url",
            engines.pdp1.url,
            "--decode-url",
            engines.pdd.url,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout[done.stdout.index("{") :])
    assert set(result["systems"]) == {"hand", "prfaas", "vllm-router"}
    for name, figures in result["systems"].items():
        assert 0 < figures["ttft_p50_ms"] <= figures["e2e_p90_ms"], (name, figures)
    assert "added_ttft_median_ms" in result["systems"]["prfaas"]
