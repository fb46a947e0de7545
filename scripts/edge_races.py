"""Evidence for two edge races of the local two-datacenter stack (prfaas_local/stack.py through
tests/integration/testbed_support.py: real engine emulators, link emulator, gateway and router processes on
127.0.0.1). Not a test, not a benchmark: an investigation that prints counts.

* ``first``: start a fresh stack ``--runs`` times; the moment the router's ``/ready`` answers 200 (nothing
  else waited for, as a readiness probe), send one long (remote-sized) and one short request at once; count
  the answers by status and route.
* ``legs``: one stack; ``--legs`` long (remote) requests one after another, each after an idle gap drawn
  uniformly from ``[--gap-min, --gap-max]`` seconds (pooled connections are reused near the keep-alive
  expiry); count the answers by status and route, the router's fallbacks and retries, and the read errors in
  the logs. ``--server-keepalive`` sets both listeners' ``security.keepaliveIdleSeconds``.

Usage: ``.venv/bin/python scripts/edge_races.py first --runs 20`` /
``.venv/bin/python scripts/edge_races.py legs --legs 400 --gap-min 3.9 --gap-max 4.1``.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from testbed_support import Processes, Stack, http, start_stack, wait_for  # noqa: E402

LONG = {"model": "m", "prompt": [1] * 40_000, "max_tokens": 2}
SHORT = {"model": "m", "prompt": [1] * 100, "max_tokens": 2}
ERRORS = ("ReadError", "RemoteProtocolError", "ServerDisconnected", "ClientOSError", "ConnectionReset")


def post(url: str, body: dict[str, Any]) -> tuple[int, str, str]:
    """(status, route header, body head) of one request."""
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.headers.get("x-prfaas-route", "?"), ""
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("x-prfaas-route", "?"), exc.read()[:300].decode(errors="replace")


def one_first_request(run: int, counts: collections.Counter[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        procs = Processes(Path(tmp))
        try:
            st = start_stack(procs, Path(tmp), wait_ready=False)

            def ready() -> bool:
                procs.check_alive()
                return http("GET", st.router + "/ready", timeout_s=2)[0] == 200

            wait_for(ready, 90, "the router's /ready", interval_s=0.01)
            out: dict[str, tuple[int, str, str]] = {}
            threads = [
                threading.Thread(target=lambda k=k, b=b: out.__setitem__(k, post(st.router + "/v1/completions", b)))
                for k, b in (("long", LONG), ("short", SHORT))
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for kind, (status, route, head) in out.items():
                counts[f"{kind} {status} {route}"] += 1
                if status != 200 or route == "fallback":
                    print(f"run {run}: {kind} -> {status} {route} {head}", flush=True)
                    lines = procs.log("router").splitlines()
                    print("\n".join(line for line in lines if "warn" in line.lower() or "error" in line.lower()))
            print(f"run {run}: {out}", flush=True)
        finally:
            procs.stop_all()


def first_requests(runs: int) -> None:
    counts: collections.Counter[str] = collections.Counter()
    for run in range(runs):
        one_first_request(run, counts)
    print("first requests (kind status route):", dict(counts))


def metric(text: str, name: str) -> float:
    lines = (line for line in text.splitlines() if line.startswith(name))
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def legs(n: int, gap_min: float, gap_max: float, server_keepalive: float | None, workers: int) -> None:
    extra = {} if server_keepalive is None else {"security": {"keepaliveIdleSeconds": server_keepalive}}
    with tempfile.TemporaryDirectory() as tmp:
        procs = Processes(Path(tmp))
        try:
            st: Stack = start_stack(procs, Path(tmp), gateway_extra=extra, **extra)
            answers: collections.Counter[str] = collections.Counter()
            started = time.monotonic()
            lock = threading.Lock()

            def worker(seed: int) -> None:
                rng = random.Random(seed)
                for _ in range(n // workers):
                    time.sleep(rng.uniform(gap_min, gap_max))  # the idle gap under study, not a synchronisation
                    status, route, _ = post(st.router + "/v1/completions", LONG)
                    with lock:
                        answers[f"{status} {route}"] += 1
                        done = sum(answers.values())
                    if done % 100 == 0:
                        print(f"{done} legs, {time.monotonic() - started:.0f} s: {dict(answers)}", flush=True)

            threads = [threading.Thread(target=worker, args=(19 + w,)) for w in range(workers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            _, text = http("GET", st.router + "/metrics")
            text = text if isinstance(text, str) else ""
            print(f"answers (status route) in {time.monotonic() - started:.0f} s:", dict(answers))
            for name in ("prfaas_router_fallbacks_total", "prfaas_router_prefill_retries_total"):
                print(name, metric(text, name))
            for proc in ("router", "gateway"):
                log = procs.log(proc)
                print(proc, "log:", {w: log.count(w) for w in ERRORS})
        finally:
            procs.stop_all()


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    f = sub.add_parser("first")
    f.add_argument("--runs", type=int, default=20)
    g = sub.add_parser("legs")
    g.add_argument("--legs", type=int, default=400)
    g.add_argument("--gap-min", type=float, default=0.0)
    g.add_argument("--gap-max", type=float, default=0.2)
    g.add_argument("--server-keepalive", type=float, default=None)
    g.add_argument("--workers", type=int, default=1, help="concurrent clients (legs are split among them)")
    a = ap.parse_args()
    if a.what == "first":
        first_requests(a.runs)
    else:
        legs(a.legs, a.gap_min, a.gap_max, a.server_keepalive, a.workers)


if __name__ == "__main__":
    main()
