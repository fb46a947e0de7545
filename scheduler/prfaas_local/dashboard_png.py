"""The Grafana dashboard (dashboards/prfaas.json) drawn with matplotlib from a real Prometheus: every panel's
own expressions run as range queries, drawn in the dashboard's grid layout. Grafana cannot run here; the
queries are the dashboard's, so the picture and the JSON cannot disagree. Used by ``prfaas up`` (against its
local Prometheus) and scripts/render_dashboard.py (against the observability stack, with an operator)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .plots import figure

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "prfaas.json"
"""The dashboard, where this is a source checkout."""
GRID_UNIT_W, GRID_UNIT_H = 0.62, 0.36  # inches per Grafana grid unit
LINK_CAP = "0.8"
"""What the dashboard's ``$link_cap`` constant becomes (the InterDCLink default maxUtilization)."""
VARIABLES = ("namespace", "pd_cluster", "prefill_cluster", "link")
"""The dashboard's label variables; outside Grafana each is "All" (``.*``)."""

QueryRange = Callable[[str, float, float, float], list[dict[str, Any]]]
"""(expression, start, end, step) -> Prometheus' range-query result."""


def substitute(expr: str, rate_interval: str = "1m", range_: str = "1h") -> str:
    """A dashboard expression as Prometheus runs it: Grafana's macros replaced, every label variable "All"."""
    out = expr.replace("$__rate_interval", rate_interval).replace("$__range", range_).replace("$link_cap", LINK_CAP)
    for name in VARIABLES:
        out = out.replace(f'=~"${name}"', '=~".*"')
    return out


def legend(fmt: str, labels: dict[str, str]) -> str:
    out = fmt
    for key in set(re.findall(r"\{\{(\w+)\}\}", fmt)):
        out = out.replace("{{" + key + "}}", labels.get(key, ""))
    return " ".join(out.split()) or "value"


def series_of(panel: dict[str, Any]) -> set[str]:
    """The metric names a panel's queries read."""
    return {m for t in panel.get("targets", []) for m in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", t["expr"])}


def exporter_of(metric: str) -> str | None:
    """Who exports ``metric`` (``names.EXPORTERS``; a histogram's ``_bucket``/``_sum``/``_count`` series are
    its own), None for a series not declared there (``up``, vLLM's)."""
    from prfaas_core.names import EXPORTERS

    for suffix in ("", "_bucket", "_sum", "_count"):
        if suffix and not metric.endswith(suffix):
            continue
        base = metric[: len(metric) - len(suffix)] if suffix else metric
        if base in EXPORTERS:
            return EXPORTERS[base]
    return None


def without_exporter(doc: dict[str, Any], exporter: str) -> tuple[dict[str, Any], list[str]]:
    """The dashboard less the panels that read only ``exporter``'s series (``names.EXPORTERS``), the panels
    left re-flowed into the grid (no holes); and the titles left out. For a picture of a system that does not
    run that exporter (``prfaas up`` has no operator): its panels would only say "no data"."""
    kept, dropped = [], []
    for panel in doc["panels"]:
        if panel["type"] == "row":
            continue
        known = {who for m in series_of(panel) if (who := exporter_of(m)) is not None}
        if known == {exporter}:
            dropped.append(str(panel["title"]))
        else:
            kept.append(panel)
    x = y = row_h = 0
    flowed = []
    for panel in kept:
        g = panel["gridPos"]
        if x + g["w"] > 24:
            x, y, row_h = 0, y + row_h, 0
        flowed.append({**panel, "gridPos": {**g, "x": x, "y": y}})
        x, row_h = x + g["w"], max(row_h, g["h"])
    return {**doc, "panels": flowed}, dropped


def render(
    doc: dict[str, Any],
    query_range: QueryRange,
    start_s: float,
    end_s: float,
    subtitle: str,
    rate_interval: str = "1m",
    no_data: str = "No data",
    time_unit: str = "wall seconds since start",
    note: str = "",
) -> tuple[bytes, int]:
    """The PNG and how many panels had data; ``note``: a line under the title (what the picture leaves out)."""
    from .plots import png

    panels = [p for p in doc["panels"] if p["type"] != "row"]
    rows = sorted({p["gridPos"]["y"] for p in panels})
    fig = figure(24 * GRID_UNIT_W, len(rows) * 8 * GRID_UNIT_H * 0.6 + 1.0)
    fig.set_facecolor("#111217")
    step = max(1.0, (end_s - start_s) / 240)
    drawn = 0
    for panel in panels:
        g = panel["gridPos"]
        row = rows.index(g["y"])
        extra = 0.02 if note else 0.0
        height = (1 - 0.04 - extra) / len(rows)
        top = 1 - 0.03 - extra - row * height
        ax = fig.add_axes((g["x"] / 24 + 0.035, top - height * 0.8, g["w"] / 24 - 0.05, height * 0.68))
        ax.set_facecolor("#181b1f")
        ax.set_title(panel["title"], color="#d8d9da", fontsize=10, loc="left")
        ax.tick_params(colors="#8e8e8e", labelsize=7)
        for spine in ax.spines.values():
            spine.set_color("#2c3235")
        ax.grid(color="#2c3235", linewidth=0.5)
        series = 0
        span = f"{max(1, round(end_s - start_s))}s"
        lines: list[tuple[str, list[float], list[float]]] = []
        for target in panel["targets"]:
            for result in query_range(substitute(target["expr"], rate_interval, span), start_s, end_s, step):
                xs = [float(t) - start_s for t, _ in result["values"]]
                ys = [float(v) for _, v in result["values"]]
                ys = [y if math.isfinite(y) else float("nan") for y in ys]
                lines.append((legend(target["legendFormat"], result["metric"])[:40], xs, ys))
                series += 1
        unit = panel["fieldConfig"]["defaults"].get("unit", "")
        if panel["type"] == "stat":
            _stat(ax, lines, unit)
        elif panel["type"] == "state-timeline":
            _states(ax, lines, panel)
        else:
            for label, xs, ys in lines:
                ax.plot(xs, ys, linewidth=1.2, label=label)
            axis = panel["fieldConfig"]["defaults"].get("custom", {}).get("axisLabel")
            if axis:
                ax.set_ylabel(axis, color="#8e8e8e", fontsize=7)
        if series:
            if panel["type"] == "timeseries":
                ax.legend(fontsize=6, loc="upper left", facecolor="#181b1f", labelcolor="#d8d9da", framealpha=0.6)
            drawn += 1
        else:
            ax.text(0.5, 0.5, no_data, color="#8e8e8e", ha="center", va="center", transform=ax.transAxes, fontsize=8)
        if panel["type"] != "stat":
            ax.set_xlabel(f"{time_unit}   [{unit}]", color="#8e8e8e", fontsize=7)
    fig.suptitle(f"{doc['title']} — {subtitle}", color="#d8d9da", fontsize=13, x=0.01, y=0.995, ha="left", va="top")
    if note:
        fig.text(0.01, 0.975, note, color="#8e8e8e", fontsize=9, ha="left", va="top")
    return png(fig, dpi=80), drawn


def _fmt(value: float, unit: str) -> str:
    if not math.isfinite(value):
        return "-"
    if unit == "percentunit":
        return f"{value * 100:.1f} %"
    if unit == "s":
        return f"{value:.3g} s"
    return f"{value:.3g}"


def _stat(ax: Any, lines: list[tuple[str, list[float], list[float]]], unit: str) -> None:
    """A stat panel: each series' last value, large, with its legend."""
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
    for i, (label, _, ys) in enumerate(lines[:4]):
        last = next((y for y in reversed(ys) if math.isfinite(y)), float("nan"))
        y = 0.75 - i * 0.45 / max(1, min(len(lines), 4) - 1) if len(lines) > 1 else 0.55
        ax.text(
            0.5, y, _fmt(last, unit), color="#73bf69", ha="center", va="center", transform=ax.transAxes, fontsize=18
        )
        ax.text(0.5, y - 0.13, label, color="#8e8e8e", ha="center", va="center", transform=ax.transAxes, fontsize=7)


def _states(ax: Any, lines: list[tuple[str, list[float], list[float]]], panel: dict[str, Any]) -> None:
    """A state timeline: one band per series, coloured by its value mapping."""
    mapping: dict[str, dict[str, Any]] = {}
    for m in panel["fieldConfig"]["defaults"].get("mappings", []):
        mapping |= m.get("options", {})
    colours = {"green": "#73bf69", "red": "#f2495c", "orange": "#ff9830", "blue": "#5794f2"}
    ax.set_yticks(range(len(lines)), [label for label, _, _ in lines], fontsize=7)
    ax.set_ylim(-0.6, max(0.6, len(lines) - 0.4))
    for row, (_, xs, ys) in enumerate(lines):
        for x0, x1, y in zip(xs, xs[1:] + xs[-1:], ys, strict=True):
            if not math.isfinite(y):
                continue
            m = mapping.get(str(int(y)) if y == int(y) else str(y), {})
            ax.fill_between(
                [x0, x1], row - 0.4, row + 0.4, color=colours.get(m.get("color", ""), "#8e8e8e"), linewidth=0
            )
    seen = {str(m.get("text")): colours.get(m.get("color", ""), "#8e8e8e") for m in mapping.values()}
    for i, (text, colour) in enumerate(seen.items()):
        ax.text(0.99, 0.95 - i * 0.1, text, color=colour, ha="right", va="top", transform=ax.transAxes, fontsize=7)


__all__ = ["DASHBOARD", "LINK_CAP", "exporter_of", "legend", "render", "series_of", "substitute", "without_exporter"]
