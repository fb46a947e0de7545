"""Emulator parity: one small scenario through our gateway and router on emulated engines and on real vLLM engines,
compared on the figures that do not depend on timing.

The scenario is sent one request at a time (so no decision depends on queues or timing), as token ids (so both
sides count the same tokens): long fresh prompts (remote), short fresh ones (local), and multi-turn sessions that
share a system prefix (the PrFaaS engine's prefix cache saves prefill, the decode engine's saves KV it need not
pull). Per request it records the route (``x-prfaas-route``), the KV the router accounted
(``prfaas_router_remote_kv_bytes_total``, in 128-token blocks of the tiny model), the KV blocks the decode engine
pulled (``vllm:nixl_bytes_transferred``), the decode engine's prompt tokens by source
(``vllm:prompt_tokens_by_source``), the router's prefix hits (``prfaas_router_prefix_hit_tokens_total`` by cluster)
and every engine's prefix-cache hits (``vllm:prefix_cache_hits``). Where the sides differ, the emulator is wrong.

    .venv/bin/python benchmarks/parity.py --smoke          # emulated side only, against the figures real vLLM gave
    .venv/bin/python benchmarks/parity.py                  # both sides (starts 3 real engines: ~7.8 GiB)
    .venv/bin/python benchmarks/parity.py --out parity.json

Prints a table (one row per request and figure that differs, then the totals) and JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from prfaas_core import names
from prfaas_core.capacity.kv import kv_model_from_profile
from prfaas_core.capacity.profiles import builtin_model_profiles
from prfaas_local.ports import free_port
from prfaas_local.procs import spawn_process, stop_processes
from prfaas_local.stack import LINK, EngineRef, LocalStack
from prfaas_local.stack_configs import VLLM_TOKEN as TOKEN
from prfaas_local.vllm_engines import BLOCK_SIZE, EnginePool, RealEnv, example_specs
from prfaas_router.state.metrics import sample_sum

THRESHOLD = 768
"""The router's t_min: a prompt whose PD-uncached part is longer goes to the PrFaaS side."""
ROUTER_BYTES_PER_BLOCK = 512 * BLOCK_SIZE
"""The routers' model on both sides is the tiny model (512 B/token), so their accounting reads in its blocks."""
EMULATOR_PROFILE = "qwen3-235b-a22b"
"""A built-in profile without fixed (linear-state) bytes: its KV bytes divide into whole blocks."""
MAX_TOKENS = 4
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass(frozen=True)
class Step:
    name: str
    ids: list[int]


def scenario(seed: int = 7) -> list[Step]:
    """Fresh long and short prompts, and three sessions of two turns over a shared 256-token system prefix."""
    rng = random.Random(seed)

    def fresh(n: int) -> list[int]:
        return [rng.randrange(10, 2000) for _ in range(n)]

    system = fresh(256)
    s1, s2, s3 = system + fresh(800), system + fresh(700), system + fresh(200)
    return [
        Step("long-1", fresh(1200)),
        Step("short-1", fresh(200)),
        Step("long-2", fresh(1000)),
        Step("short-2", fresh(300)),
        Step("s1-turn1", s1),
        Step("s2-turn1", s2),
        Step("s1-turn2", s1 + fresh(150)),
        Step("s2-turn2", s2 + fresh(100)),
        Step("s3-turn1", s3),
        Step("s3-turn2", s3 + fresh(100)),
    ]


RECORDED: dict[str, tuple[Any, ...]] = {
    # what real vLLM 0.32 gave for each step of scenario() (the full mode's real side, 1 PD prefill engine; the
    # figures in FIGURES' order): measured on 7 Dec 2026, and identical on every run (nothing here is timed). Since
    # the router books only the blocks the decode lacks (x-prfaas-decode-cached-tokens), its remote KV blocks are
    # the blocks the decode pulled (s1-turn2: 2, where it booked the whole prompt's 10 before)
    "long-1": ("remote", 10, 10, 1200, 0, 1200, 0, 0, 0, 0, 0),
    "short-1": ("local", 0, 2, 200, 0, 200, 0, 0, 0, 0, 0),
    "long-2": ("remote", 8, 8, 1000, 0, 1000, 0, 0, 0, 0, 0),
    "short-2": ("local", 0, 3, 300, 0, 300, 0, 0, 0, 0, 0),
    "s1-turn1": ("remote", 9, 9, 1056, 0, 1056, 0, 0, 0, 0, 0),
    "s2-turn1": ("remote", 6, 6, 700, 256, 956, 0, 256, 256, 0, 256),
    "s1-turn2": ("remote", 2, 2, 182, 1024, 1206, 0, 1024, 1024, 0, 1024),
    "s2-turn2": ("remote", 2, 2, 160, 896, 1056, 0, 896, 896, 0, 896),
    "s3-turn1": ("local", 0, 2, 200, 256, 456, 0, 256, 0, 0, 256),
    "s3-turn2": ("local", 0, 2, 172, 384, 556, 384, 256, 0, 384, 384),
}


@dataclass(frozen=True)
class Side:
    """One side's stack: the router's URL and the engines by role."""

    router: str
    prfaas: str
    pd_prefill: list[str]
    decode: str
    engine_bytes_per_block: float


def _metrics(url: str) -> str:
    return httpx.get(url + "/metrics", headers=AUTH, timeout=30).text


def _engine_figures(text: str) -> dict[str, float]:
    out = {
        "nixl_bytes": sample_sum(text, names.VLLM_NIXL_BYTES_TRANSFERRED + "_sum") or 0.0,
        "prefix_queries": sample_sum(text, names.VLLM_PREFIX_CACHE_QUERIES) or 0.0,
        "prefix_hits": sample_sum(text, names.VLLM_PREFIX_CACHE_HITS) or 0.0,
        "prompt_tokens": sample_sum(text, names.VLLM_PROMPT_TOKENS) or 0.0,
    }
    for source in names.PROMPT_SOURCES:
        out[source] = sample_sum(text, names.VLLM_PROMPT_TOKENS_BY_SOURCE, {"source": source}) or 0.0
    return out


def _router_figures(text: str) -> dict[str, float]:
    out = {"remote_kv_bytes": sample_sum(text, names.METRIC_ROUTER_REMOTE_BYTES) or 0.0}
    for cluster in ("pd", "prfaas"):
        out[f"prefix_hit_{cluster}"] = (
            sample_sum(text, names.METRIC_ROUTER_PREFIX_HIT_TOKENS, {"cluster": cluster}) or 0
        )
    return out


def _snapshot(side: Side) -> dict[str, dict[str, float]]:
    engines = {"prfaas": side.prfaas, "decode": side.decode}
    engines.update({f"pd-prefill-{i}": url for i, url in enumerate(side.pd_prefill)})
    snap = {name: _engine_figures(_metrics(url)) for name, url in engines.items()}
    snap["router"] = _router_figures(_metrics(side.router))
    return snap


def run_side(side: Side, steps: Sequence[Step], model: str) -> list[dict[str, Any]]:
    """Send the steps one at a time; per step, the timing-independent figures it moved."""
    rows = []
    with httpx.Client(timeout=180) as client:
        for step in steps:
            before = _snapshot(side)
            body = {"model": model, "prompt": step.ids, "max_tokens": MAX_TOKENS, "temperature": 0}
            r = client.post(side.router + "/v1/completions", json=body)
            if r.status_code != 200:
                raise RuntimeError(f"{step.name}: the router answered {r.status_code}: {r.text[:300]}")
            after = _snapshot(side)

            def moved(who: str, what: str) -> float:
                return after[who][what] - before[who][what]  # noqa: B023 (used at once)

            pd_hits = sum(moved(k, "prefix_hits") for k in after if k.startswith("pd-prefill-"))
            rows.append(
                {
                    "step": step.name,
                    "prompt_tokens": len(step.ids),
                    "route": r.headers.get("x-prfaas-route"),
                    "router_kv_blocks": round(moved("router", "remote_kv_bytes") / ROUTER_BYTES_PER_BLOCK, 3),
                    "pulled_blocks": round(moved("decode", "nixl_bytes") / side.engine_bytes_per_block, 3),
                    "decode_external_tokens": moved("decode", "external_kv_transfer"),
                    "decode_cache_hit_tokens": moved("decode", "local_cache_hit"),
                    "decode_prompt_tokens": moved("decode", "prompt_tokens"),
                    "router_prefix_hit_pd": moved("router", "prefix_hit_pd"),
                    "router_prefix_hit_prfaas": moved("router", "prefix_hit_prfaas"),
                    "prfaas_prefix_hits": moved("prfaas", "prefix_hits"),
                    "pd_prefill_prefix_hits": pd_hits,
                    "decode_prefix_hits": moved("decode", "prefix_hits"),
                }
            )
    return rows


FIGURES = (
    "route",
    "router_kv_blocks",
    "pulled_blocks",
    "decode_external_tokens",
    "decode_cache_hit_tokens",
    "decode_prompt_tokens",
    "router_prefix_hit_pd",
    "router_prefix_hit_prfaas",
    "prfaas_prefix_hits",
    "pd_prefill_prefix_hits",
    "decode_prefix_hits",
)


def recorded_rows() -> list[dict[str, Any]]:
    """The recorded real figures as rows (the smoke mode compares the emulated side with them)."""
    return [{"step": step, **dict(zip(FIGURES, values, strict=True))} for step, values in RECORDED.items()]


def compare(left: list[dict[str, Any]], right: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every (step, figure) where the two sides differ."""
    out = []
    for a, b in zip(left, right, strict=True):
        for figure in FIGURES:
            if a[figure] != b[figure]:
                out.append({"step": a["step"], "figure": figure, "emulated": a[figure], "real": b[figure]})
    return out


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"routes": {}}
    for row in rows:
        out["routes"][row["route"]] = out["routes"].get(row["route"], 0) + 1
        for figure in FIGURES[1:]:
            out[figure] = round(out.get(figure, 0) + row[figure], 3)
    return out


# --- the emulated side ---------------------------------------------------------------------------------------
def _wait_healthy(urls: Sequence[str], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    for url in urls:
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the emulated engine at {url} did not start in {timeout_s} s")
            time.sleep(0.1)


@contextmanager
def emulated_engines(work: Path, n_pd_prefill: int, model: str) -> Iterator[dict[str, EngineRef | list[EngineRef]]]:
    """``prfaas engine`` processes mirroring the real topology: block size 128, served as ``model``."""
    roles = [("prfaas", "prefill"), *((f"pdp{i}", "prefill") for i in range(n_pd_prefill)), ("pdd", "decode")]
    procs, refs = [], {}
    work.mkdir(parents=True, exist_ok=True)
    try:
        for name, role in roles:
            port = free_port()
            argv = [sys.executable, "-m", "prfaas_cli.main", "engine", "--role", role, "--port", str(port)]
            argv += ["--model", model, "--model-profile", EMULATOR_PROFILE, "--block-size", str(BLOCK_SIZE)]
            argv += ["--time-scale", "100", "--engine-id", f"emulated-{name}"]
            procs.append(spawn_process(argv, work / f"{name}.log"))
            refs[name] = EngineRef(name, f"http://127.0.0.1:{port}")
        _wait_healthy([r.url for r in refs.values()])
        yield {
            "prfaas": refs["prfaas"],
            "pd_prefill": [refs[f"pdp{i}"] for i in range(n_pd_prefill)],
            "decode": refs["pdd"],
        }
    finally:
        stop_processes(procs)


def _without_tokenizer(config: dict[str, Any]) -> dict[str, Any]:
    """The prompts are token ids: a router needs no tokenizer file to count them."""
    config.pop("tokenizerFile", None)
    config["model"].pop("tokenizer", None)
    return config


@contextmanager
def stack_over(
    work: Path, env: RealEnv, prfaas: EngineRef, pd_prefill: list[EngineRef], decode: EngineRef, tokenizer: bool
) -> Iterator[LocalStack]:
    """Our gateway in front of ``prfaas`` and our router in front of the PD engines (t_min = THRESHOLD)."""
    st = LocalStack.over_vllm(work, env)
    fix: Callable[[dict[str, Any]], dict[str, Any]] = (lambda c: c) if tokenizer else _without_tokenizer
    try:
        st.start_router("gateway", fix(st.make_gateway_config(prfaas)))
        st.wait_ready("gateway")
        config = fix(st.make_router_config(pd_prefill, [decode], "gateway", THRESHOLD))
        config["links"] = [{"name": LINK, "capacityGbps": 100}]
        st.start_router("router", config)
        st.wait_ready("router")
        yield st
    finally:
        st.close()


def emulated_rows(work: Path, n_pd_prefill: int, steps: Sequence[Step]) -> list[dict[str, Any]]:
    model = "tiny-llama"
    env = RealEnv(python=sys.executable, model="", tokenizer_file="", served_model_name=model, versions={})
    kv = kv_model_from_profile(builtin_model_profiles()[EMULATOR_PROFILE])
    with emulated_engines(work / "engines", n_pd_prefill, model) as e:
        prfaas, pd, decode = e["prfaas"], e["pd_prefill"], e["decode"]
        assert isinstance(prfaas, EngineRef) and isinstance(decode, EngineRef) and isinstance(pd, list)
        with stack_over(work / "stack", env, prfaas, pd, decode, tokenizer=False) as st:
            side = Side(st.url("router"), prfaas.url, [p.url for p in pd], decode.url, kv.kv_bytes(BLOCK_SIZE))
            return run_side(side, steps, model)


# --- the real side -------------------------------------------------------------------------------------------
def real_rows(
    work: Path, env: RealEnv, prfaas: EngineRef, pd: list[EngineRef], decode: EngineRef, steps: Sequence[Step]
) -> list[dict[str, Any]]:
    """The scenario over real engines somebody started (the tier's, or :func:`start_real`'s)."""
    with stack_over(work / "real-stack", env, prfaas, pd, decode, tokenizer=True) as st:
        side = Side(st.url("router"), prfaas.url, [p.url for p in pd], decode.url, float(ROUTER_BYTES_PER_BLOCK))
        return run_side(side, steps, env.served_model_name)


@contextmanager
def start_real(work: Path) -> Iterator[tuple[RealEnv, EngineRef, list[EngineRef], EngineRef]]:
    """1 PrFaaS prefill, 1 PD prefill and 1 PD decode engine from examples/04-real-engines (~7.8 GiB)."""
    env = RealEnv.prepare()
    pool = EnginePool(env, work / "real-engines")
    specs = example_specs()
    try:
        prfaas = pool.start("prfaas", pool.on_this_host(specs["prfaas-cpu"]["prfaas-prefill"]))
        pdp = pool.start("pdp0", pool.on_this_host(specs["pd-cpu"]["pd-prefill"]))
        pdd = pool.start("pdd", pool.on_this_host(specs["pd-cpu"]["pd-decode"]))
        pool.wait_ready([prfaas, pdp, pdd])
        for producer in (prfaas, pdp):
            pool.warm_up(producer, pdd)
        refs = (EngineRef("prfaas", prfaas.url), [EngineRef("pdp0", pdp.url)], EngineRef("pdd", pdd.url))
        yield env, *refs
    finally:
        pool.close()


def report(emulated: list[dict[str, Any]], real: list[dict[str, Any]], real_label: str) -> dict[str, Any]:
    differ = compare(emulated, real)
    cols = ("route", "router_kv_blocks", "pulled_blocks", "decode_cache_hit_tokens", "prfaas_prefix_hits")
    print(f"{'step':<10} " + " ".join(f"{c:>24}" for c in cols))
    for x, y in zip(emulated, real, strict=True):
        cells = (f"{x[c]:g}/{y[c]:g}" if isinstance(x[c], float | int) else f"{x[c]}/{y[c]}" for c in cols)
        print(f"{x['step']:<10} " + " ".join(f"{cell:>24}" for cell in cells))
    print(f"(emulated/{real_label}); {len(differ)} figure(s) differ")
    for d in differ:
        print(f"  {d['step']}: {d['figure']} emulated {d['emulated']} vs {real_label} {d['real']}")
    return {
        "emulated": emulated,
        real_label: real,
        "totals": {"emulated": totals(emulated), real_label: totals(real)},
        "differ": differ,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="the emulated side only, against the recorded real figures")
    ap.add_argument("--out", help="write the JSON here too")
    args = ap.parse_args(argv)
    steps = scenario()
    work = Path(tempfile.mkdtemp(prefix="prfaas-parity-"))
    emulated = emulated_rows(work / "emulated", 1, steps)
    if args.smoke:
        result = report(emulated, recorded_rows(), "recorded")
    else:
        with start_real(work) as (env, prfaas, pd, decode):
            real = real_rows(work, env, prfaas, pd, decode, steps)
        result = report(emulated, real, "real")
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 1 if result["differ"] else 0


if __name__ == "__main__":
    sys.exit(main())
