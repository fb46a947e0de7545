"""The real-engine tier's skip policy: under ``PRFAAS_REQUIRE_REAL=1`` (``.ci/run`` sets it) anything that would
skip a real-engine test fails it instead; elsewhere it skips and says why."""

from __future__ import annotations

import os

import pytest

from prfaas_local.vllm_engines import REPO, RealEngine, RealEnginesUnavailable, RealEnv

REQUIRE_REAL = os.environ.get("PRFAAS_REQUIRE_REAL") == "1"

__all__ = ["REPO", "REQUIRE_REAL", "RealEngine", "prepare_or_skip", "skip_or_fail"]


def skip_or_fail(reason: str) -> None:
    """Skip the test (and say why), or fail it under PRFAAS_REQUIRE_REAL=1."""
    if REQUIRE_REAL:
        pytest.fail(f"real-engine tier required (PRFAAS_REQUIRE_REAL=1) but: {reason}", pytrace=False)
    pytest.skip(reason)


def prepare_or_skip() -> RealEnv:
    if os.environ.get("PRFAAS_SKIP_REAL") == "1":
        skip_or_fail("PRFAAS_SKIP_REAL=1")
    try:
        return RealEnv.prepare()
    except RealEnginesUnavailable as exc:
        skip_or_fail(str(exc))
        raise
