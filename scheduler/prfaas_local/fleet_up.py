"""``prfaas up --fleet``: the live fleet (:mod:`.fleet`: 2 sites, 2 regions, 4 links, emulated engines) under
steady load from both regions, through four phases (model seconds):

1. **steady**: both regions prefer site-1 (its links first; equal predicted TTFT), whose gateway books both links
   under its site cap;
2. **cut**: east's link to site-1 is cut: east's remote prefills move to site-2 (the delay is reported);
3. **squeeze**: site-2's egress cap is squeezed (its gateway's ``siteEgressCapGbps``) to one pull's rate: its
   egress, by its relays' own 1-s counters, stays under the squeezed cap (plus the shaper's burst), where its two
   relays could carry twice that;
4. **drain**: site-2 is drained: after what it held finishes (``SETTLE_S``, and until its engines are idle:
   ``drain_settled``) it takes no new work (east, its other site cut, prefills locally).

Every request is answered (a remote call cut mid-way falls back to the local prefill). The report (printed, and
``summary.json`` in the work dir): per phase the requests, the KV each gateway served per link, each site's busiest
settled 1-s window against its cap.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from .fleet import FleetSpec, FleetStack, link_name, settled

PHASES = ("steady", "cut", "squeeze", "drain")
TOKENS = 20_000
SETTLE_S = 60.0
"""Model seconds after the drain before site-2's new work is counted: the prefills it held then finish."""


class _Load:
    """Two clients per region, one long request after another each; every answer's status, by phase."""

    def __init__(self, fleet: FleetStack) -> None:
        self.fleet, self.phase = fleet, PHASES[0]
        self.stop = threading.Event()
        self.statuses: dict[str, list[int]] = {p: [] for p in PHASES}
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        self.threads = [
            threading.Thread(target=self._client, args=(rs.url("router"),), daemon=True)
            for rs in self.fleet.regions.values()
            for _ in range(2)
        ]
        for t in self.threads:
            t.start()

    def _client(self, url: str) -> None:
        with httpx.Client(timeout=120.0) as client:
            while not self.stop.is_set():
                body = {"model": "m", "prompt": uuid.uuid4().hex + "x" * (TOKENS * 4 - 32), "max_tokens": 4}
                phase = self.phase
                try:
                    status = client.post(url + "/v1/completions", json=body).status_code
                except httpx.HTTPError:
                    status = -1
                self.statuses[phase].append(status)


def _served(fleet: FleetStack) -> dict[str, dict[str, float]]:
    return {site: fleet.gateway_bytes(site) for site in fleet.spec.sites}


def _delta(after: dict[str, dict[str, float]], before: dict[str, dict[str, float]]) -> dict[str, float]:
    """KV Gbit each link's gateway served between two readings (model Gbit)."""
    out: dict[str, float] = {}
    for site, links in after.items():
        for link, nbytes in links.items():
            out[link] = round((nbytes - before.get(site, {}).get(link, 0.0)) * 8.0 / 1e9, 3)
    return out


def run_fleet(args: argparse.Namespace) -> int:
    """Start the fleet, run the phases (``--duration`` model seconds each, default 60), print the report."""
    spec = FleetSpec()
    if args.time_scale is not None:
        spec = replace(spec, time_scale=args.time_scale)
    phase_s = args.duration if args.duration is not None else 60.0
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="prfaas-up-fleet-"))
    work.mkdir(parents=True, exist_ok=True)
    fleet = FleetStack(spec, work)
    load = _Load(fleet)
    report: dict[str, Any] = {"phases": [], "site_cap_gbps": spec.site_cap_gbps, "work_dir": str(work)}
    try:
        fleet.start()
        load.start()
        caps = dict.fromkeys(spec.sites, spec.site_cap_gbps)
        for phase in PHASES:
            load.phase, before, first = phase, _served(fleet), int(_model_now(spec.time_scale))
            if phase == "cut":
                cut = link_name("east", "site-1")
                cut_at = fleet.cut(cut)
                moved = _wait_moved(fleet, before, cut_at, phase_s)
                report["cut_to_move_model_s"] = moved
            elif phase == "squeeze":  # to one pull at a time (a pull runs at its relay's rate, nothing slows it)
                caps["site-2"] = spec.site_nic_gbps / spec.n_prfaas
                fleet.squeeze("site-2", caps["site-2"])
            elif phase == "drain":
                fleet.drain("site-2")
                time.sleep(SETTLE_S / spec.time_scale)  # what site-2 held when drained finishes: at least this,
                report["drain_settled"] = fleet.sites["site-2"].wait_idle(120.0)  # and until its engines are idle
                before = _served(fleet)
            time.sleep(phase_s / spec.time_scale)
            after = _served(fleet)
            windows = {s: settled(fleet.site_windows(s), first + 2) for s in spec.sites}
            report["phases"].append(
                {
                    "phase": phase,
                    "requests": len(load.statuses[phase]),
                    "answered": sum(1 for s in load.statuses[phase] if s == 200),
                    "served_gbit": _delta(after, before),
                    "busiest_gbps": {s: round(max(w.values(), default=0.0), 3) for s, w in windows.items()},
                    "site_cap_gbps": dict(caps),
                }
            )
        load.stop.set()
        for t in load.threads:
            t.join(120)
        report["requests"] = sum(len(v) for v in load.statuses.values())
        report["lost"] = sum(1 for v in load.statuses.values() for s in v if s != 200)
        report["burst_gbit"] = round(fleet.burst_gbit(), 3)
    finally:
        load.stop.set()
        fleet.stop()
    (work / "summary.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=2) if args.output == "json" else _table(report))
    return 0 if report.get("lost", 1) == 0 else 1


def _model_now(time_scale: float) -> float:
    """The relays' model clock (their 1-s windows' keys): the machine's monotonic clock, scaled."""
    return time.monotonic() * time_scale


def _wait_moved(fleet: FleetStack, before: dict[str, dict[str, float]], cut_at: float, limit_s: float) -> float | None:
    """Model seconds from the cut until site-2 served east's first prefill after it (None: not within the
    phase)."""
    link, start = link_name("east", "site-2"), before.get("site-2", {}).get(link_name("east", "site-2"), 0.0)
    deadline = cut_at + 3 * limit_s / fleet.spec.time_scale + 30.0
    while time.monotonic() < deadline:
        if fleet.gateway_bytes("site-2").get(link, 0.0) > start:
            return round((time.monotonic() - cut_at) * fleet.spec.time_scale, 1)
        time.sleep(0.05)
    return None


def _table(report: dict[str, Any]) -> str:
    lost = report.get("lost", "?")
    lines = [f"fleet: {report.get('requests', 0)} requests, {lost} lost; work dir {report['work_dir']}"]
    lines.append(f"cut east-to-site-1 -> east at site-2 after {report.get('cut_to_move_model_s')} model s")
    lines.append(f"{'phase':<8} {'answered':>9}  busiest 1-s window / site cap (Gbps)   KV served (Gbit) by link")
    for p in report["phases"]:
        sites = ", ".join(f"{s} {g:g}/{p['site_cap_gbps'][s]:g}" for s, g in p["busiest_gbps"].items())
        served = ", ".join(f"{k} {v:g}" for k, v in sorted(p["served_gbit"].items()))
        lines.append(f"{p['phase']:<8} {p['answered']:>4}/{p['requests']:<4}  {sites:<36} {served}")
    lines.append(f"(a window may pass its cap by the shaper's burst: {report.get('burst_gbit')} Gbit)")
    return "\n".join(lines)
