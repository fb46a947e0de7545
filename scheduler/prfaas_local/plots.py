"""What every ``--plot-dir`` shares: a headless matplotlib figure, its PNG bytes, and the directory checks.

Commands render their plots into ``{file name: PNG bytes}`` first and write them only once everything else
succeeded, so that bad input never leaves half a set of images behind.
"""

from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path
from typing import Any

PLOTS_EXTRA = "matplotlib is not installed; it comes with the plots extra: pip install 'prfaas[plots]'"


class PlotDirError(ValueError):
    """The ``--plot-dir`` cannot hold the plots (names the path and why)."""


class MissingPlotsExtra(ImportError):
    """Plots were asked for without the ``plots`` extra (matplotlib)."""


def require_matplotlib() -> None:
    """Fail early, naming the extra, when matplotlib is absent (the base install carries no plotting)."""
    if importlib.util.find_spec("matplotlib") is None:
        raise MissingPlotsExtra(PLOTS_EXTRA)


def figure(width: float, height: float) -> Any:
    """A matplotlib Figure on the Agg backend (no display, no global pyplot state)."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


def png(fig: Any, dpi: int = 110) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def check_plot_dir(path_text: str, create: bool = False) -> Path:
    """The directory, if it is one or can become one (created now with ``create``)."""
    path = Path(path_text)
    try:
        require_matplotlib()
    except MissingPlotsExtra as exc:
        raise PlotDirError(f"--plot-dir {path}: {exc}") from None
    if path.exists() and not path.is_dir():
        raise PlotDirError(f"--plot-dir {path}: exists and is not a directory")
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PlotDirError(f"--plot-dir {path}: cannot create: {exc}") from None
    return path


def write_plots(plot_dir: Path, images: dict[str, bytes]) -> None:
    """Create the directory and write every image, reporting each file on stderr."""
    try:
        plot_dir.mkdir(parents=True, exist_ok=True)
        for name, data in images.items():
            (plot_dir / name).write_bytes(data)
            print(f"wrote {plot_dir / name}", file=sys.stderr)
    except OSError as exc:
        raise PlotDirError(f"--plot-dir {plot_dir}: {exc}") from None
