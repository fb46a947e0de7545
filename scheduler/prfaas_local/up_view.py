"""``prfaas up``'s live view: on a terminal, a ``rich`` panel redrawn once a second (the phase, the PD roles
over time, ``t`` against its floor, egress against the cap, TTFT by route against the SLO in this phase, the
last decision with its reason, wrapped — never cut); otherwise one plain line every 10 wall seconds.
Everything goes to stderr (stdout carries only the summary, or only JSON with ``-o json``). The panel needs the
``live`` extra (rich); without it a terminal gets the plain lines and one note naming the extra."""

from __future__ import annotations

import importlib.util
import sys
import time
from typing import Any, TextIO

from prfaas_core.api import SloSpec

from .load import summarize
from .local_loop import LocalCluster
from .scenario import phase_at
from .up_session import SessionState

LIVE_EXTRA = "the live view needs rich, which comes with the live extra: pip install 'prfaas[live]'"


def facts(st: SessionState, cluster: LocalCluster, slo: SloSpec) -> dict[str, Any]:
    """The numbers both views show."""
    now = st.model_now()
    phase = phase_at(st.phases, now)
    p, d = cluster.counts()
    roles_seen: list[str] = []
    for c in st.cycles:
        label = f"{c.prefill}P/{c.decode}D"
        if not roles_seen or roles_seen[-1] != label:
            roles_seen.append(label)
    if not roles_seen or roles_seen[-1] != f"{p}P/{d}D":
        roles_seen.append(f"{p}P/{d}D")
    last_router = st.router[-1] if st.router else None
    recent = st.egress[-5:]
    in_phase = [r for r in st.results if r.sent_at is not None and phase.contains(r.arrival_s)]
    routes = {}
    for route in ("local", "remote"):
        sub = [r for r in in_phase if r.route == route]
        if sub:
            s = summarize(sub, slo)
            routes[route] = (len(sub), s.ttft_p50_s, s.ttft_p90_s, s.attainment)
    last = st.cycles[-1] if st.cycles else None
    return {
        "now": now,
        "wall": time.perf_counter() - st.started,
        "scale": st.time_scale,
        "phase": phase,
        "index": st.phases.index(phase) + 1,
        "roles": f"{p}P/{d}D",
        "roles_seen": roles_seen[-6:],
        "t": last_router.threshold_tokens if last_router else None,
        "t_min": cluster.config.threshold_min_tokens,
        "scarce": bool(last_router and last_router.scarce),
        "egress": sum(recent) / len(recent) if recent else 0.0,
        "cap": st.cap_gbps,
        "routes": routes,
        "done": len(st.results),
        "last": last,
        "capacity": capacity_line(st),
    }


def capacity_line(st: SessionState) -> str | None:
    """Elastic capacity now: each cluster's desired vs ready against its demand (None: fixed sizes)."""
    last = {s.cluster: s for s in st.capacity}
    if not last:
        return None
    parts = [
        f"{label} {s.ready}/{s.desired} ready (demand {s.demand:.1f})"
        for key, label in (("prfaas", "PrFaaS"), ("pd", "PD"))
        if (s := last.get(key)) is not None
    ]
    return ", ".join(parts)


def plain_line(f: dict[str, Any]) -> str:
    t = "-" if f["t"] is None else f"{f['t']:.0f}"
    routes = " ".join(
        f"{r} {n} p90 {p90 if p90 is None else round(p90, 1)}s SLO {att:.0%}"
        for r, (n, _, p90, att) in f["routes"].items()
    )
    last = f["last"]
    decision = f"{last.action}: {last.reason}" if last else "-"
    return (
        f"[model {f['now']:5.0f}s wall {f['wall']:4.0f}s {f['phase'].name}] roles {f['roles']} | "
        f"t {t} (floor {f['t_min']}) | egress "
        f"{f['egress']:.1f}/{f['cap']:g} Gbps {'scarce' if f['scarce'] else 'abundant'} | {routes} | done "
        f"{f['done']} | last {decision}" + (f" | capacity {f['capacity']}" if f["capacity"] else "")
    )


class LiveView:
    """The view; ``update`` is the session's ``on_tick``."""

    def __init__(self, slo: SloSpec, total: int, stream: TextIO | None = None, serve: bool = False) -> None:
        self.slo, self.total, self.serve = slo, total, serve
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._last_plain = 0.0
        self._live: Any = None
        if self.tty and importlib.util.find_spec("rich") is None:
            print(f"up: {LIVE_EXTRA}; a plain line every 10 s instead", file=self.stream, flush=True)
            self.tty = False
        if self.tty:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(console=Console(file=self.stream), refresh_per_second=2, transient=False)
            self._live.start()

    def update(self, st: SessionState, cluster: LocalCluster) -> None:
        f = facts(st, cluster, self.slo)
        if self._live is not None:
            self._live.update(self._panel(f))
        elif time.perf_counter() - self._last_plain >= 10.0:
            self._last_plain = time.perf_counter()
            print(plain_line(f), file=self.stream, flush=True)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()

    def _panel(self, f: dict[str, Any]) -> Any:
        from rich.panel import Panel
        from rich.table import Table

        ph = f["phase"]
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column(overflow="fold")
        grid.add_row("phase", f"{f['index']}. {ph.name} (model {ph.start_s:g}-{ph.end_s:g} s): {ph.expect}")
        if f["capacity"]:
            grid.add_row("capacity", f["capacity"])
        grid.add_row("roles P/D", f"[bold]{f['roles']}[/]   so far: {' -> '.join(f['roles_seen'])}")
        t = "-" if f["t"] is None else f"{f['t']:.0f}"
        raised = f["t"] is not None and f["t"] > f["t_min"]
        grid.add_row(
            "t", f"[bold]{t}[/] tokens, floor t_min {f['t_min']}" + ("  [yellow](raised)[/]" if raised else "")
        )
        state = "[red]scarce[/]" if f["scarce"] else "[green]abundant[/]"
        grid.add_row("egress", f"{f['egress']:.1f} of cap {f['cap']:g} Gbps (model), link {state}")
        for route in ("local", "remote"):
            if route in f["routes"]:
                n, p50, p90, att = f["routes"][route]
                colour = "green" if att >= 0.9 else "yellow" if att >= 0.5 else "red"
                grid.add_row(
                    f"TTFT {route}",
                    f"{n} requests this phase, p50/p90 {_s(p50)}/{_s(p90)} s (model), "
                    f"within the SLO [{colour}]{att:.0%}[/]",
                )
        last = f["last"]
        grid.add_row(
            "last decision",
            f"[bold]{last.action}[/] at model {last.model_s:.0f} s: {last.reason}" if last else "-",
        )
        total = "serving (Ctrl-C to stop)" if self.serve else f"{f['done']}/{self.total} answered"
        title = f"prfaas up — model {f['now']:.0f} s (wall {f['wall']:.0f} s x {f['scale']:g}), {total}"
        return Panel(grid, title=title, title_align="left")


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


__all__ = ["LiveView", "facts", "plain_line"]
