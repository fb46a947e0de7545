"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from prfaas_testbed.k8s_emulator import EmulatorThread
from prfaas_testbed.operator_harness import Harness


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    """The operator test harness (emulator, Prometheus, gateway), every process closed afterwards."""
    harness = Harness(tmp_path)
    try:
        yield harness
    finally:
        harness.close()


@pytest.fixture
def emu() -> Iterator[EmulatorThread]:
    """The Kubernetes API emulator alone (kmock over HTTP), stopped afterwards."""
    emulator = EmulatorThread().start()
    try:
        yield emulator
    finally:
        emulator.stop()
