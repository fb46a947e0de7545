"""Replaying a trace against an OpenAI-compatible endpoint (our router, a peer router, or one engine), time
scaled, and judging each request against the SLOs.

Prompts are sent as token ids (the completions API accepts them), so every hop counts the same tokens and
no one spends CPU tokenising: each session keeps its last prompt, and a request reuses its first
``shared_prefix_tokens`` ids and appends fresh ones — prefix caches see exactly the sharing the trace holds.
Each request streams (with usage), so the client measures TTFT and TPOT. Times are reported in *model*
seconds (wall x time_scale), the unit the SLOs are written in.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

from prfaas_core.trace import TraceRecord

ROUTE_HEADER = "x-prfaas-route"


@dataclass(frozen=True)
class Slo:
    """TTFT = base + per-1K (1024) uncached tokens; decode at least ``min_decode_tps`` per stream."""

    ttft_base_s: float = 2.0
    ttft_per_k_s: float = 0.2
    min_decode_tps: float = 40.0

    def ttft_limit_s(self, uncached_tokens: int) -> float:
        return self.ttft_base_s + self.ttft_per_k_s * uncached_tokens / 1024.0


@dataclass
class Result:
    index: int
    input_tokens: int
    uncached_tokens: int
    output_tokens: int
    status: int = 0
    route: str = "n/a"
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    error: str = ""

    def meets(self, slo: Slo) -> bool:
        if self.status != 200 or self.ttft_s is None:
            return False
        if self.ttft_s > slo.ttft_limit_s(self.uncached_tokens):
            return False
        return self.tpot_s is None or self.tpot_s <= 1.0 / slo.min_decode_tps


@dataclass
class PromptBuilder:
    """Token-id prompts honouring the trace's per-session shared prefixes."""

    seed: int = 0
    vocab: int = 151_936
    _last: dict[str, list[int]] = field(default_factory=dict)
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def ids(self, rec: TraceRecord) -> list[int]:
        prev = self._last.get(rec.session_id, [])
        shared = prev[: min(rec.shared_prefix_tokens, len(prev), rec.input_tokens)]
        fresh = [self._rng.randrange(self.vocab) for _ in range(rec.input_tokens - len(shared))]
        ids = shared + fresh
        self._last[rec.session_id] = ids
        return ids


async def _one(
    client: httpx.AsyncClient, url: str, model: str, index: int, rec: TraceRecord, ids: list[int], scale: float
) -> Result:
    res = Result(index, rec.input_tokens, rec.uncached_tokens, rec.output_tokens)
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": rec.output_tokens,
        "min_tokens": rec.output_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first: float | None = None
    tokens = 0
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
            res.status = resp.status_code
            res.route = resp.headers.get(ROUTE_HEADER, "n/a")
            if resp.status_code != 200:
                res.error = (await resp.aread()).decode(errors="replace")[:200]
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    res.status, res.error = 502, str(chunk["error"])[:200]
                    return res
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    tokens += 1
                    if first is None:
                        first = time.perf_counter()
    except httpx.HTTPError as exc:
        res.status, res.error = 599, f"{exc.__class__.__name__}: {exc}"[:200]
        return res
    end = time.perf_counter()
    if first is not None:
        res.ttft_s = (first - start) * scale
        if tokens > 1:
            res.tpot_s = (end - first) * scale / (tokens - 1)
    res.e2e_s = (end - start) * scale
    return res


async def replay(
    url: str,
    records: Sequence[TraceRecord],
    time_scale: float = 1.0,
    model: str = "prfaas",
    seed: int = 0,
    on_result: Callable[[Result], None] | None = None,
    max_connections: int = 2048,
) -> list[Result]:
    """Send every request at ``arrival_s / time_scale`` wall seconds after the start; wait for all."""
    builder = PromptBuilder(seed)
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=256)
    timeout = httpx.Timeout(600.0, connect=10.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        start = time.perf_counter()
        tasks: list[asyncio.Task[Result]] = []
        for i, rec in enumerate(records):
            ids = builder.ids(rec)
            delay = rec.arrival_s / time_scale - (time.perf_counter() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(_one(client, url, model, i, rec, ids, time_scale))
            if on_result is not None:
                task.add_done_callback(lambda t: on_result(t.result()) if not t.cancelled() else None)
            tasks.append(task)
        return list(await asyncio.gather(*tasks))


@dataclass(frozen=True)
class Summary:
    requests: int
    ok: int
    meets_slo: int
    attainment: float
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    routes: dict[str, int]

    def as_json(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "ok": self.ok,
            "meets_slo": self.meets_slo,
            "slo_attainment": round(self.attainment, 4),
            "ttft_p50_s": None if self.ttft_p50_s is None else round(self.ttft_p50_s, 3),
            "ttft_p90_s": None if self.ttft_p90_s is None else round(self.ttft_p90_s, 3),
            "routes": self.routes,
        }


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def summarize(results: Sequence[Result], slo: Slo) -> Summary:
    ok = [r for r in results if r.status == 200]
    meets = sum(1 for r in results if r.meets(slo))
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    routes: dict[str, int] = {}
    for r in results:
        routes[r.route] = routes.get(r.route, 0) + 1
    return Summary(
        len(results),
        len(ok),
        meets,
        meets / len(results) if results else 0.0,
        _quantile(ttfts, 0.5),
        _quantile(ttfts, 0.9),
        routes,
    )
