"""Memory under repeated floods (issue 39 item 9): the router's and the gateway's resident memory after each of
several floods of long requests, on the emulated two-datacenter stack (real processes on 127.0.0.1: a PrFaaS engine
behind the gateway and its link relay, a PD prefill and a PD decode engine, the router). Once caches and pools are
warm the figures should level off: the full run reports how far the RSS after floods 3, 4 and 5 lie apart (the
target: within 5 % for each process). Before the fixes the gateway grew 154 -> 286 -> 339 -> 363 -> 371 -> 401 MB
over five floods of 200 x 32K-token requests.

    .venv/bin/python benchmarks/soak_floods.py [--floods 5] [--requests 200] [--tokens 32000] [--smoke] [--out F]

The smoke mode (2 floods of 6 requests of 2,000 tokens) runs in the default test run; the full one behind
``scripts/test.sh --full`` (tests/integration/test_benchmarks_smoke.py, marker ``slow``). Prints JSON and writes it
to ``--out`` (default out/bench/soak.json). Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from prfaas_local.stack import LocalStack
from prfaas_local.stack_configs import StackSpec


def rss_mb(pid: int) -> float:
    """A process's resident set (VmRSS), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no VmRSS for pid {pid}")


def pid_of(stack: LocalStack, name: str) -> int:
    assert stack.procs is not None
    return next(p.pid for n, p in stack.procs.procs if n == name)


async def flood(url: str, requests: int, tokens: int, concurrency: int) -> dict[str, int]:
    """``requests`` long prompts, ``concurrency`` at a time; the answers' statuses counted."""
    statuses: dict[str, int] = {}
    gate = asyncio.Semaphore(concurrency)

    async def one(session: aiohttp.ClientSession) -> None:
        head = uuid.uuid4().hex
        body = {"prompt": head + "x" * (tokens * 4 - len(head)), "max_tokens": 2}
        async with gate:
            try:
                async with session.post(url + "/v1/completions", json=body) as resp:
                    await resp.read()
                    key = str(resp.status)
            except (aiohttp.ClientError, TimeoutError) as exc:
                key = exc.__class__.__name__
        statuses[key] = statuses.get(key, 0) + 1

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(one(session) for _ in range(requests)))
    return statuses


def spread(values: list[float]) -> float:
    """(max - min) / min of ``values``, a fraction."""
    return (max(values) - min(values)) / min(values) if values and min(values) > 0 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--floods", type=int, default=5)
    ap.add_argument("--requests", type=int, default=200, help="requests per flood")
    ap.add_argument("--tokens", type=int, default=32_000, help="prompt tokens per request")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--smoke", action="store_true", help="2 floods of 6 requests of 2,000 tokens")
    ap.add_argument("--out", default="out/bench/soak.json")
    args = ap.parse_args()
    if args.smoke:
        args.floods, args.requests, args.tokens, args.concurrency = 2, 6, 2_000, 6
    spec = StackSpec(n_prfaas=1, n_pd=2, initial_prefill=1, time_scale=200.0, threshold_min_tokens=19_634)
    work = Path(tempfile.mkdtemp(prefix="prfaas-soak-"))
    stack = LocalStack(spec, work)
    rows: list[dict[str, Any]] = []
    try:
        stack.start()
        pids = {"router": pid_of(stack, "router"), "gateway": pid_of(stack, "gateway")}
        rows.append({"flood": 0, **{f"{n}_mb": round(rss_mb(p), 1) for n, p in pids.items()}})
        for i in range(1, args.floods + 1):
            started = time.perf_counter()
            statuses = asyncio.run(flood(stack.url("router"), args.requests, args.tokens, args.concurrency))
            row = {"flood": i, "seconds": round(time.perf_counter() - started, 2), "statuses": statuses}
            rows.append(row | {f"{n}_mb": round(rss_mb(p), 1) for n, p in pids.items()})
    finally:
        stack.stop()
    tail = [r for r in rows if 3 <= r["flood"] <= 5]  # the target's floods, however many ran
    out = {
        "floods": rows,
        "requests_per_flood": args.requests,
        "prompt_tokens": args.tokens,
        "level_off": {
            n: {"spread_after_floods_3_to_5": round(spread([r[f"{n}_mb"] for r in tail]), 4)} if tail else None
            for n in ("router", "gateway")
        },
    }
    text = json.dumps(out, indent=2)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
