"""scripts/gen_docs.py ``--check`` (a step of scripts/test.sh) fails on a generated page that is missing or edited
by hand, and passes once the script rewrote it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_check_fails_on_a_missing_or_hand_edited_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = gen_docs()
    monkeypatch.setattr(mod, "REFERENCE", tmp_path)
    assert mod.main(["--check"]) == 1  # missing
    assert mod.main([]) == 0 and mod.main(["--check"]) == 0
    page = tmp_path / "metrics.md"
    page.write_text(page.read_text().replace("prfaas_router_requests_total", "prfaas_router_requests"))
    assert mod.main(["--check"]) == 1
    assert mod.main([]) == 0 and "prfaas_router_requests_total" in page.read_text()
