"""What our router adds on real engines: TTFT and end-to-end latency through `prfaas router` over the bare
two-leg P/D exchange done by hand, next to vllm-router 0.1.17 in PD mode, on the same real vLLM engines
(CPU build, the tiny generated model, NixlConnector over UCX TCP) in one run.

Each round sends one fresh prompt (no prefix-cache hits) through each system in turn, streamed; TTFT is the
first content chunk, end-to-end the last byte. Prints a table and JSON (``--out``), and plots the
distributions (``--plot``).

    .venv/bin/python benchmarks/real_engines.py                       # starts a PD prefill and a PD decode engine
    .venv/bin/python benchmarks/real_engines.py --smoke                # 3 rounds (the default test run does this)
    .venv/bin/python benchmarks/real_engines.py --prefill-url URL --decode-url URL   # engines already running
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from prfaas_local.procs import stop_processes
from prfaas_local.stack import EngineRef, LocalStack
from prfaas_local.vllm_engines import EnginePool, Prompts, RealEnv, start_vllm_router
from prfaas_router.state.wire import decode_body, kv_handle, prefill_body

SYSTEMS = ("hand", "prfaas", "vllm-router")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def stream_ttft(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, float]:
    """(TTFT, end-to-end) of one streamed completion, seconds."""
    started = time.perf_counter()
    first: float | None = None
    with client.stream("POST", url + "/v1/completions", json={**body, "stream": True}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url} answered {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if first is None and line.startswith("data: {"):
                first = time.perf_counter()
    end = time.perf_counter()
    return (first or end) - started, end - started


def by_hand(client: httpx.Client, prefill: str, decode: str, body: dict[str, Any]) -> tuple[float, float]:
    """The bare exchange: the prefill leg, then the decode leg streamed with the KV handle (no router)."""
    started = time.perf_counter()
    r = client.post(prefill + "/v1/completions", json=prefill_body(body))
    r.raise_for_status()
    handle = kv_handle(r.json())
    prefilled = time.perf_counter() - started
    ttft, e2e = stream_ttft(client, decode, decode_body(body, handle))
    return prefilled + ttft, prefilled + e2e


def run(args: argparse.Namespace) -> dict[str, Any]:
    env = RealEnv.load(Path(args.env_file)) if args.env_file else RealEnv.prepare()
    work = Path(tempfile.mkdtemp(prefix="prfaas-real-bench-"))
    pool: EnginePool | None = None
    stack = LocalStack.over_vllm(work / "stack", env)
    procs = []
    try:
        if args.prefill_url and args.decode_url:
            prefill_url, decode_url = args.prefill_url, args.decode_url
        else:
            pool = EnginePool(env, work / "engines")
            p = pool.start("prefill", pool.spec("pd-prefill"))
            d = pool.start("decode", pool.spec("pd-decode"))
            print("starting a PD prefill and a PD decode engine (about a minute)...", file=sys.stderr)
            pool.wait_ready([p, d])
            pool.warm_up(p, d)
            prefill_url, decode_url = p.url, d.url
        prefill, decode = EngineRef("prefill", prefill_url), EngineRef("decode", decode_url)
        # every request local (t above any prompt): the router's own work, without a remote leg
        stack.start_router("router", stack.make_router_config([prefill], [decode], None, 1 << 20))
        stack.wait_ready("router")
        vr_url, vr_proc = start_vllm_router(prefill_url, decode_url, work / "vllm-router.log")
        procs.append(vr_proc)
        prompts = Prompts(env.tokenizer_file, args.seed)
        systems: dict[str, Callable[[httpx.Client, dict[str, Any]], tuple[float, float]]] = {
            "hand": lambda c, b: by_hand(c, prefill_url, decode_url, b),
            "prfaas": lambda c, b: stream_ttft(c, stack.url("router"), b),
            "vllm-router": lambda c, b: stream_ttft(c, vr_url, b),
        }
        samples: dict[str, dict[str, list[float]]] = {s: {"ttft": [], "e2e": []} for s in SYSTEMS}
        with httpx.Client(timeout=120) as client:
            for name in SYSTEMS:  # one untimed request each: connections, handshakes
                systems[name](client, _body(env, prompts.text(args.prompt_tokens), args.max_tokens))
            for i in range(args.rounds):
                order = list(SYSTEMS) if i % 2 == 0 else list(reversed(SYSTEMS))
                for name in order:
                    ttft, e2e = systems[name](client, _body(env, prompts.text(args.prompt_tokens), args.max_tokens))
                    samples[name]["ttft"].append(ttft)
                    samples[name]["e2e"].append(e2e)
                print(f"round {i + 1}/{args.rounds}", file=sys.stderr)
        return report(samples, args)
    finally:
        stop_processes(procs)
        stack.close()
        if pool is not None:
            pool.close()


def _body(env: RealEnv, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": env.served_model_name,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


def report(samples: dict[str, dict[str, list[float]]], args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {
        "rounds": args.rounds,
        "prompt_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens,
        "systems": {},
    }
    for name, s in samples.items():
        out["systems"][name] = {
            f"{k}_{q}_ms": round(percentile(v, p) * 1000, 2)
            for k, v in s.items()
            for q, p in (("p50", 0.5), ("p90", 0.9))
        }
    base = samples["hand"]
    for name in ("prfaas", "vllm-router"):
        out["systems"][name]["added_ttft_median_ms"] = round(
            (statistics.median(samples[name]["ttft"]) - statistics.median(base["ttft"])) * 1000, 2
        )
        out["systems"][name]["added_e2e_median_ms"] = round(
            (statistics.median(samples[name]["e2e"]) - statistics.median(base["e2e"])) * 1000, 2
        )
    print(f"{'system':<12} {'TTFT p50':>10} {'TTFT p90':>10} {'e2e p50':>10} {'e2e p90':>10} {'+TTFT':>8} {'+e2e':>8}")
    for name, fig in out["systems"].items():
        print(
            f"{name:<12} {fig['ttft_p50_ms']:>10.1f} {fig['ttft_p90_ms']:>10.1f} {fig['e2e_p50_ms']:>10.1f} "
            f"{fig['e2e_p90_ms']:>10.1f} {fig.get('added_ttft_median_ms', 0):>8.1f} "
            f"{fig.get('added_e2e_median_ms', 0):>8.1f}"
        )
    if args.plot:
        plot(samples, Path(args.plot))
    return out


def plot(samples: dict[str, dict[str, list[float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title in ((axes[0], "ttft", "TTFT"), (axes[1], "e2e", "End-to-end")):
        ax.boxplot([[v * 1000 for v in samples[s][key]] for s in SYSTEMS], tick_labels=list(SYSTEMS))
        ax.set_title(f"{title} on real vLLM (CPU, tiny model)")
        ax.set_ylabel("ms (log scale: KV pulls on CPU vLLM have long stalls)")
        ax.set_yscale("log")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=30, help="timed requests per system (default 30)")
    p.add_argument("--prompt-tokens", type=int, default=1000, help="prompt length in the model's tokens")
    p.add_argument("--max-tokens", type=int, default=32, help="generated tokens per request")
    p.add_argument("--smoke", action="store_true", help="3 rounds of 300-token prompts (the test run's check)")
    p.add_argument("--prefill-url", help="a running PD prefill engine (else one is started)")
    p.add_argument("--decode-url", help="a running PD decode engine (else one is started)")
    p.add_argument("--env-file", help="the real-engine environment file (default: run scripts/real-engines.sh)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", help="write the JSON here too")
    p.add_argument("--plot", help="write a PNG of the distributions here")
    args = p.parse_args(argv)
    if args.smoke:
        args.rounds, args.prompt_tokens, args.max_tokens = 3, 300, 8
    result = run(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
