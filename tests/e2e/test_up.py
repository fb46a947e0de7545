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

from prfaas_link.config import shaper_burst_gbit

# the scenario's phases are judged by what the long-term loop saw at time scale 4-8: with another test's engines
# starting beside it, stolen CPU becomes model latency and the phases' decisions change (scripts/test.sh runs these
# after the parallel run, one at a time)
pytestmark = pytest.mark.solo

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

    # the project's alert rules, evaluated by up's Prometheus over the whole healthy run (both regions, each
    # labelled as the chart's monitors label it): no alert was even pending, but the operator's missing-series one
    # (up runs the long-term loop itself, with no operator process to scrape)
    assert summary.get("alerts") is not None, "no local Prometheus with the rules (scripts/system-deps.sh)"
    assert [a for a in summary["alerts"] if a["alertname"] != "PrfaasOperatorMetricsMissing"] == []
    assert {a["alertname"] for a in summary["alerts"]} == {"PrfaasOperatorMetricsMissing"}

    # logs of every process, and none of them left running
    logs = {p.stem for p in (work / "logs").glob("*.log")}
    assert {"router", "gateway", "prfaas-0", "prfaas-1", "link-0", "link-1", "pd-0", "pd-3"} <= logs
    assert stack_processes(work) == []
    assert "plan for 2 PrFaaS + 4 PD" in result.stderr
    print(f"prfaas up: {req['requests']} requests, {routes}, {wall:.0f} s wall")


@pytest.mark.timeout(300)
def test_link_scheduling_books_every_remote_pull_at_the_gateway(tmp_path: Path) -> None:
    """``--link-scheduling paced``: the gateway's calendar books every remote prefill's pull (its own counters, in
    the summary) and every pull is reported over by the router, none waits out its lease; every request is
    answered; egress stays within the cap and the relays' burst. The real engines have no such stack: refused
    before anything starts."""
    work = tmp_path / "up"
    result = run_up(
        work, "--duration", "40", "--time-scale", "8", "--load", "0.4", "--link-gbps", "10", "--link-scheduling",
        "paced", "--prometheus", "off",
    )  # fmt: skip
    assert result.returncode == 0, f"exit {result.returncode}\nstderr:\n{result.stderr[-3000:]}"
    s: dict[str, Any] = json.loads(result.stdout)
    req = s["requests"]
    assert req["requests"] >= 10 and req["ok"] == req["requests"], s["errors"]
    ls = s["link_scheduling"]
    remote = req["routes"].get("remote", 0)
    assert ls["mode"] == "paced" and remote > 0, (ls, req["routes"])
    assert ls["admissions"]["booked"] >= remote, ls
    assert ls["pulls"]["reported"] >= 1 and ls["pulls"]["lease"] == 0, ls
    # paced: each relay runs at its share of the cap through every phase (a phase's reshape keeps the pacing), so no
    # 1-s window (the relays' own accounting) passes the cap by more than one shaper grant per relay (2 relays)
    assert s["egress_windows"] == "relays"
    assert s["egress_peak_gbps"] <= s["link_cap_gbps"] + shaper_burst_gbit(2, 1e-3), s["phases"]
    assert all(p["egress_windows_over_cap"] == 0 for p in s["phases"]), s["phases"]
    gateway = json.loads((work / "gateway.json").read_text())
    assert gateway["gateway"]["admission"]["link"] == "a-to-b"

    refused = run_up(tmp_path / "vllm", "--engines", "vllm", "--link-scheduling", "gateway", timeout_s=60)
    assert refused.returncode == 2 and "--link-scheduling" in refused.stderr


SHORT = Path(__file__).parent / "data" / "up-short.yaml"
SHAPER_BURST_GBITS = shaper_burst_gbit(1, 1e-3)
"""One relay chunk (LinkConfig.chunk_bytes) of wire bytes in model Gbit at byte scale 1e-3: what a 1-s window
may carry above the rate (the shaper grants whole chunks)."""


@pytest.mark.timeout(400)
def test_the_phases_show_both_timescales(tmp_path: Path) -> None:
    """The default scenario's phases, shortened: long prompts flip a PD instance toward prefill and re-optimise
    t_min; the squeezed link turns scarce and the router raises t while egress settles under the new cap; the
    recovery brings t back to t_min and the instance back. Every request is answered. Ranges, not values."""
    work = tmp_path / "up"
    plots = tmp_path / "plots"
    result = run_up(work, "--scenario", str(SHORT), "--seed", "2", "--plot-dir", str(plots), timeout_s=380)
    assert result.returncode == 0, f"exit {result.returncode}\nstderr:\n{result.stderr[-3000:]}"
    s: dict[str, Any] = json.loads(result.stdout)
    phases = {p["name"]: p for p in s["phases"]}
    assert list(phases) == ["steady", "long-prompts", "squeeze", "recovery"]
    req = s["requests"]
    assert req["requests"] >= 100 and req["ok"] == req["requests"], s["errors"]
    assert sum(p["requests"]["requests"] for p in s["phases"]) == req["requests"]
    assert (plots / "up.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # steady: the planner's split holds, the link is abundant
    steady = phases["steady"]
    assert steady["roles_end"] == {"prefill": 2, "decode": 2}
    assert steady["flips"] == [] and steady["link_scarce_share"] == 0.0

    # long prompts: a drain toward prefill, judged by the observed mix, then the flip once the instance has
    # drained (its in-flight decodes may carry it into the squeeze), and t_min re-optimised up
    assert phases["long-prompts"]["actions"].get("Drain", 0) >= 1, phases["long-prompts"]
    flips = s["role_flips"]
    to_prefill = [f for f in flips if f["action"] == "FlipToPrefill"]
    assert to_prefill, [c["reason"] for c in s["last_decisions"]]
    first = to_prefill[0]
    assert first["phase"] in ("long-prompts", "squeeze") and "prefill-bound" in first["reason"], first
    assert "drained" in first["reason"]  # never flipped with requests in flight
    assert first["roles"]["prefill"] == 3 and first["threshold_min_tokens"] > s["plan"]["threshold_tokens"]

    # squeeze: the long prompts' KV does not fit the 3 Gbps link: it turns scarce (the router's own measure)
    # for part of the phase, the router raises t above the loop's floor t_min, and remote prefills go on
    squeeze = phases["squeeze"]
    assert squeeze["link_gbps"] == 3 and squeeze["link_cap_gbps"] == pytest.approx(2.4)
    assert 0 < squeeze["link_scarce_share"] < 1, squeeze
    assert squeeze["router_threshold_tokens"]["max"] > squeeze["threshold_min_tokens"]["max"], squeeze
    assert squeeze["egress_mean_gbps"] > 0
    # egress in the relays' own 1-s model windows, once the KV admitted before the squeeze has landed: under the
    # new cap on average (admission books every stream at most at the cap); a single window may pass the cap while
    # two admitted pulls overlap (pulls are not paced to their booking: vLLM's are not), never the wire's rate
    # (allowance: one shaper grant, a 64 KiB chunk = 0.52 Gbit of model bytes at byte scale 1e-3)
    assert s["egress_windows"] == "relays"
    assert squeeze["egress_mean_settled_gbps"] <= squeeze["link_cap_gbps"], squeeze
    assert squeeze["egress_peak_settled_gbps"] <= squeeze["link_gbps"] + SHAPER_BURST_GBITS, squeeze

    # recovery: abundant again, t back down to t_min, and the instance flips back toward decode
    rec = phases["recovery"]
    assert rec["link_scarce_share"] < 1
    assert rec["router_threshold_tokens"]["min"] < squeeze["router_threshold_tokens"]["max"]
    # the router applied the last published t_min: its t never stands below it, and equals it once the router
    # sees the whole link again (abundant, its cap the configured one). On a loaded machine slow pulls can keep the
    # router's available-bandwidth estimate bounding the cap for a while after the squeeze (then t stays above)
    loop = s["loop"]
    assert loop["router_threshold_tokens"] >= loop["published_threshold_min_tokens"], loop
    if not loop["router_link_scarce"] and loop["router_link_cap_gbps"] == pytest.approx(rec["link_cap_gbps"]):
        assert loop["router_threshold_tokens"] == loop["published_threshold_min_tokens"], loop
    back = [f for f in flips if f["action"] == "FlipToDecode" and f["model_s"] > first["model_s"]]
    assert back, ([(f["action"], f["model_s"], f["phase"]) for f in flips], [c["reason"] for c in s["last_decisions"]])
    assert "decode-bound" in back[0]["reason"]
    assert s["final_roles"] == {"prefill": 2, "decode": 2}
    print(f"phases: flips {[(f['action'], f['model_s']) for f in flips]}, {req['requests']} requests")


@pytest.mark.timeout(120)
def test_prfaas_up_stops_its_processes_when_terminated(tmp_path: Path) -> None:
    """SIGTERM in the middle of the replay: exit non-zero, every process of the stack stopped."""
    work = tmp_path / "up"
    argv = [*PRFAAS, "up", "--work-dir", str(work), "--duration", "600", "--time-scale", "4", "--prometheus", "off"]
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
