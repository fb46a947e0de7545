"""Shared test helpers: repository paths."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
INVALID = REPO / "tests" / "data" / "invalid"


@pytest.fixture
def repo() -> Path:
    return REPO
