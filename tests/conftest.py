"""Shared test helpers: repository paths."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

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
REAL = REPO / "tests" / "real"
REAL_SCOPE = REAL.relative_to(REPO).as_posix()
"""The real-engine tier's node-id prefix: one unit of work under xdist."""


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist with ``--dist loadfile`` (``scripts/test.sh`` runs ``-n 2 --dist loadfile
    --no-loadscope-reorder``): each module is one unit of work, on one worker (its module fixtures start once), and
    the whole real-engine tier is one unit, on one worker, in its own order (the machine holds one engine set, not
    two). (``--dist loadgroup`` would say this with marks, but xdist 3.8 cannot rename pytest 9's node ids.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class TierScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return REAL_SCOPE if nodeid.startswith(REAL_SCOPE + "/") else super()._split_scope(nodeid)

    return TierScheduling(config, log)


@pytest.hookimpl(tryfirst=True)  # tests/real/conftest.py then orders the tier in the places it holds
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker the real-engine tier is collected first, so its unit is handed out first: it is the
    longest, and the other worker takes the remaining modules meanwhile."""
    if not hasattr(config, "workerinput"):
        return
    items.sort(key=lambda item: REAL not in item.path.parents)  # stable: each side keeps its order


@pytest.fixture
def repo() -> Path:
    return REPO
