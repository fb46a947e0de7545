"""Shared test helpers: repository paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests: no per-example deadline (a loaded 2-core machine is slow, not wrong); under CI
# (.ci/run exports PRFAAS_REQUIRE_REAL, CI runners export CI) a fixed seed, so a run is repeatable and a
# failure replays; elsewhere hypothesis explores new examples each run. HYPOTHESIS_PROFILE overrides.
settings.register_profile("default", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE")
    or ("ci" if os.environ.get("CI") or os.environ.get("PRFAAS_REQUIRE_REAL") else "default")
)

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
INVALID = REPO / "tests" / "data" / "invalid"


@pytest.fixture
def repo() -> Path:
    return REPO
