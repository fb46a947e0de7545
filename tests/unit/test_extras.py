"""What the base install lacks is named, never a traceback: plots need the ``plots`` extra (matplotlib), the
live view the ``live`` extra (rich). The missing package is simulated by hiding it from the import system; the
image and the clean-venv install (test_image.py, test_package.py) check the same without it installed at all."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path
from typing import Any

import pytest

from prfaas_cli.main import main
from prfaas_core.api import SloSpec
from prfaas_local import plots, up_view


def hide(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    real = importlib.util.find_spec

    def find_spec(module: str, *args: Any, **kwargs: Any) -> Any:
        return None if module.split(".")[0] == name else real(module, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_a_plot_without_matplotlib_names_the_plots_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    hide(monkeypatch, "matplotlib")
    with pytest.raises(plots.MissingPlotsExtra, match=r"pip install 'prfaas\[plots\]'"):
        plots.figure(4, 3)
    assert main(["plan", "--plot-dir", str(tmp_path / "plots")]) == 1
    err = capsys.readouterr().err
    assert "matplotlib is not installed" in err and "pip install 'prfaas[plots]'" in err
    assert not (tmp_path / "plots").exists()


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_live_view_without_rich_falls_back_to_plain_lines_and_names_the_live_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hide(monkeypatch, "rich")
    stream = Tty()
    view = up_view.LiveView(SloSpec(), 10, stream=stream)
    assert view._live is None and not view.tty
    assert "pip install 'prfaas[live]'" in stream.getvalue()
    view.close()
