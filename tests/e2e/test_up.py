"""End to end: ``prfaas up`` as a user runs it — a real process that starts the whole two-datacenter stack
(emulated PrFaaS and PD engines, the shaped link, the gateway, the router, the long-term loop), replays
traffic through it and writes a summary. Short and fast-clocked (60 model seconds at 8x); behaviour only,
no timing thresholds (SLO attainment on a shared 2-core machine is the benchmarks' business)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

PRFAAS = [sys.executable, "-m", "prfaas_cli.main"]


def stack_processes(work: Path) -> list[int]:
    """PIDs of live processes of the run's stack: every one writes its output to a log under the work dir."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            out = os.readlink(entry / "fd" / "1")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if out.startswith(str(work)) and state != "Z":
            pids.append(int(entry.name))
    return pids


def run_up(work: Path, *extra: str, timeout_s: float = 240.0) -> subprocess.CompletedProcess[str]:
    argv = [*PRFAAS, "up", "--work-dir", str(work), "--output", "json", *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)


@pytest.mark.timeout(300)
def test_prfaas_up_runs_the_stack_end_to_end(tmp_path: Path) -> None:
    work = tmp_path / "up"
    started = time.monotonic()
    plots = tmp_path / "plots"
    result = run_up(
        work, "--duration", "60", "--time-scale", "8", "--load", "0.4", "--seed", "3", "--plot-dir", str(plots)
    )
    wall = time.monotonic() - started
    assert result.returncode == 0, f"exit {result.returncode}\nstderr:\n{result.stderr[-3000:]}"
    printed: dict[str, Any] = json.loads(result.stdout)
    summary: dict[str, Any] = json.loads((work / "summary.json").read_text())
    assert printed == summary
    assert (plots / "up.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # every request answered, by both routes
    req = summary["requests"]
    assert req["requests"] >= 20
    assert req["ok"] == req["requests"], summary["errors"]
    assert summary["errors"] == []
    routes = req["routes"]
    assert routes.get("local", 0) > 0 and routes.get("remote", 0) > 0, routes
    assert sum(routes.values()) == req["requests"]
    assert set(summary["by_route"]) == set(routes)
    assert 0.0 <= req["slo_attainment"] <= 1.0
    assert req["meets_slo"] + sum(req["slo_misses"].values()) == req["requests"]
    assert req["ttft_p50_s"] is not None and 0 < req["ttft_p50_s"] <= req["ttft_p90_s"]

    # KV crossed the link, and its 1-second egress never went above the cap
    assert summary["link_cap_gbps"] == pytest.approx(80.0)
    assert 0 < summary["egress_peak_gbps"] <= summary["link_cap_gbps"]
    assert 0 < summary["egress_mean_gbps"] <= summary["egress_peak_gbps"]

    # the long-term loop ran and published t: the router's config file carries it, and the router's t in force
    # is never below it
    loop = summary["loop"]
    assert loop["cycles"] >= 2 and sum(loop["actions"].values()) == loop["cycles"]
    published = json.loads((work / "router.json").read_text())
    assert published["thresholdMinTokens"] == loop["published_threshold_min_tokens"] == summary["threshold_tokens"]
    assert loop["router_threshold_tokens"] is not None
    assert loop["router_threshold_tokens"] >= loop["published_threshold_min_tokens"] > 0
    assert summary["plan"]["n_prefill"] + summary["plan"]["n_decode"] == 4
    assert sum(summary["final_roles"].values()) == 4

    # logs of every process, and none of them left running
    logs = {p.stem for p in (work / "logs").glob("*.log")}
    assert {"router", "gateway", "prfaas-0", "prfaas-1", "link-0", "link-1", "pd-0", "pd-3"} <= logs
    assert stack_processes(work) == []
    assert "plan for 2 PrFaaS + 4 PD" in result.stderr
    print(f"prfaas up: {req['requests']} requests, {routes}, {wall:.0f} s wall")


@pytest.mark.timeout(120)
def test_prfaas_up_stops_its_processes_when_terminated(tmp_path: Path) -> None:
    """SIGTERM in the middle of the replay: exit non-zero, every process of the stack stopped."""
    work = tmp_path / "up"
    argv = [*PRFAAS, "up", "--work-dir", str(work), "--duration", "600", "--time-scale", "4"]
    err = tmp_path / "stderr.txt"
    with open(err, "wb") as stderr:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and "done " not in err.read_text(errors="replace"):
            assert proc.poll() is None, err.read_text(errors="replace")[-2000:]
            time.sleep(0.2)
        assert "done " in err.read_text(errors="replace"), "the replay never started"
        assert len(stack_processes(work)) == 10
        time.sleep(2.0)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 10
    while stack_processes(work) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert stack_processes(work) == []
    assert proc.returncode != 0
