"""Micro-benchmark of the router's hot path, in-process: the routing decision alone (the core's policy call
over the current snapshot: prefix-index lookups, decide_route, admission) versus the work around it that is
reported separately — token counting of a text prompt and prefix-block hashing. Prints JSON.

    .venv/bin/python benchmarks/router_decision.py [--requests 20000]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from prfaas_core.api import RouterConfig
from prfaas_core.policy.routing import RouteRequest, RoutingView, decide_route
from prfaas_core.profiles import builtin_model_profiles
from prfaas_core.tokens import block_hashes, build_tokenizer
from prfaas_router.runtime import Runtime, compile_config


def config() -> RouterConfig:
    model = builtin_model_profiles()["internal-1t"].model_dump(mode="json", by_alias=True, exclude_none=True)
    return RouterConfig.model_validate(
        {
            "pdCluster": "pd",
            "thresholdMinTokens": 19_634,
            "model": model,
            "endpoints": [
                {"name": f"pd-{i}", "url": f"http://127.0.0.1:{9000 + i}", "role": "prefill" if i < 3 else "decode"}
                for i in range(8)
            ],
            "remotes": [{"name": "prfaas", "url": "http://127.0.0.1:9100", "link": "a-to-b"}],
            "links": [{"name": "a-to-b", "capacityGbps": 100}],
        }
    )


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def us(values: list[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(values) * 1e6, 2), "p99": round(pct(values, 0.99) * 1e6, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20_000)
    args = ap.parse_args()
    rng = random.Random(0)
    rt = Runtime(compile_config(config()))
    tok = build_tokenizer("chars4")
    dist = __import__("prfaas_core.plan_inputs", fromlist=["x"]).case_study_inputs().lengths
    lengths = [dist.sample(rng) for _ in range(args.requests)]
    # warm the prefix index with half the sessions, so lookups find something
    prompts = [[rng.randrange(150_000) for _ in range(min(n, 4096))] for n in lengths[:200]]
    hashes = [block_hashes(p, 16) for p in prompts]
    for i, h in enumerate(hashes[:100]):
        rt.pd_index.insert(h, f"pd-{i % 8}")
    c = rt.compiled
    view = RoutingView(19_634, "abundant", 10.0, c.links["a-to-b"], True)
    policy_s, lookup_s, decide_s, plan_s = [], [], [], []
    for i, n in enumerate(lengths):
        h = hashes[i % len(hashes)]
        t0 = time.perf_counter()
        decide_route(RouteRequest(n, 1024, 0), view, c.kv, c.prfaas.prefill_seconds)
        t1 = time.perf_counter()
        hits = rt.pd_index.match(h)
        t2 = time.perf_counter()
        rt.decide(n, h, hits)
        t3 = time.perf_counter()
        rt.plan_local(n, h, hits)
        t4 = time.perf_counter()
        policy_s.append(t1 - t0)
        lookup_s.append(t2 - t1)
        decide_s.append(t3 - t2)
        plan_s.append(t4 - t3)
    text = "x" * (27_000 * 4)
    t0 = time.perf_counter()
    ids = tok.encode(text)
    tokenize_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    block_hashes(ids, 16)
    hash_s = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "requests": args.requests,
                "policy_call_us": us(policy_s),
                "prefix_lookup_256_blocks_us": us(lookup_s),
                "decision_incl_remote_lookup_us": us(decide_s),
                "instance_pick_us": us(plan_s),
                "tokenize_27k_tokens_ms": round(tokenize_s * 1e3, 2),
                "prefix_hash_27k_tokens_ms": round(hash_s * 1e3, 2),
                "target_policy_call_p99_us": 50,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
