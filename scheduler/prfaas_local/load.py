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
import contextlib
import json
import random
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from prfaas_core.api import SloSpec
from prfaas_core.names import SERVER_TIMING
from prfaas_core.request.slo import ttft_objective_s
from prfaas_core.request.trace import TraceRecord
from prfaas_router.state.wire import parse_timing

ROUTE_HEADER = "x-prfaas-route"
EGRESS = "prfaas_link_egress_bytes_total"


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
    sent_at: float | None = None
    """Wall clock (perf_counter) when the request was sent; None while not sent."""
    arrival_s: float = 0.0
    """When the trace has it arrive (model seconds from the replay's start): what places it in a phase, however
    late a loaded client sent it."""
    done: bool = False
    timing: dict[str, float] = field(default_factory=dict)
    """The answer's ``Server-Timing`` (phase -> model seconds): where the router and the gateway spent its time."""

    def meets(self, slo: SloSpec) -> bool:
        if self.status != 200 or self.ttft_s is None:
            return False
        if self.ttft_s > ttft_objective_s(slo, self.input_tokens):
            return False
        return self.tpot_s is None or self.tpot_s <= 1.0 / slo.min_decode_tokens_per_second

    def missed(self, slo: SloSpec, now: float, time_scale: float) -> bool:
        """Already certain to miss the SLO: finished and not met, or still without a first token past its TTFT
        limit (a replay can stop early once enough requests have missed)."""
        if self.done:
            return not self.meets(slo)
        if self.sent_at is None or self.ttft_s is not None:
            return False
        return (now - self.sent_at) * time_scale > ttft_objective_s(slo, self.input_tokens)

    def miss_reason(self, slo: SloSpec) -> str | None:
        """Why a finished request missed the SLO (``error``, ``ttft`` or ``tpot``), None when it met it."""
        if self.status != 200 or self.ttft_s is None:
            return "error"
        if self.ttft_s > ttft_objective_s(slo, self.input_tokens):
            return "ttft"
        if self.tpot_s is not None and self.tpot_s > 1.0 / slo.min_decode_tokens_per_second:
            return "tpot"
        return None


@dataclass
class PromptBuilder:
    """Token-id prompts honouring the trace's per-session shared prefixes.

    Fresh ids are drawn 16 bits at a time (every id below 65 536 is in any vocabulary the emulators use):
    a 30K-token prompt costs well under a millisecond, not tens of ms of ``randrange`` calls."""

    seed: int = 0
    _last: dict[str, list[int]] = field(default_factory=dict)
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def ids(self, rec: TraceRecord) -> list[int]:
        prev = self._last.get(rec.session_id, [])
        shared = prev[: min(rec.shared_prefix_tokens, len(prev), rec.input_tokens)]
        n = rec.input_tokens - len(shared)
        fresh = array("H", self._rng.randbytes(2 * n)).tolist() if n > 0 else []
        ids = shared + fresh
        self._last[rec.session_id] = ids
        return ids


def request_body(ids: list[int], output_tokens: int, model: str = "prfaas") -> bytes:
    """The streamed completions request (with usage) the replay sends, encoded once."""
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": output_tokens,
        "min_tokens": output_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return json.dumps(body, separators=(",", ":")).encode()


def prepare_bodies(records: Sequence[TraceRecord], seed: int = 0, model: str = "prfaas") -> list[bytes]:
    """Every request body of a replay, built before its clock starts (the client's CPU then stays out of the
    measured window; about 6 bytes per prompt token)."""
    builder = PromptBuilder(seed)
    return [request_body(builder.ids(rec), rec.output_tokens, model) for rec in records]


async def _one(session: aiohttp.ClientSession, url: str, res: Result, body: bytes, scale: float) -> Result:
    try:
        return await _send(session, url, res, body, scale)
    finally:
        res.done = True


async def _send(session: aiohttp.ClientSession, url: str, res: Result, body: bytes, scale: float) -> Result:
    start = res.sent_at = time.perf_counter()
    first: float | None = None
    tokens = 0
    try:
        async with session.post(f"{url}/v1/completions", data=body, headers=_JSON) as resp:
            res.status = resp.status
            res.route = resp.headers.get(ROUTE_HEADER, "n/a")
            timing = parse_timing(resp.headers.get(SERVER_TIMING))
            res.timing = {k: v / 1000.0 * scale for k, v in timing.items()}
            if resp.status != 200:
                res.error = (await resp.read()).decode(errors="replace")[:200]
                return res
            async for raw in resp.content:
                if not raw.startswith(b"data: ") or raw.startswith(b"data: [DONE]"):
                    continue
                chunk = json.loads(raw[6:])
                if "error" in chunk:
                    res.status, res.error = 502, str(chunk["error"])[:200]
                    return res
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    tokens += 1
                    if first is None:
                        first = time.perf_counter()
                        res.ttft_s = (first - start) * scale
    except (aiohttp.ClientError, TimeoutError) as exc:
        res.status, res.error = 599, f"{exc.__class__.__name__}: {exc}"[:200]
        return res
    end = time.perf_counter()
    if first is not None:
        res.ttft_s = (first - start) * scale
        if tokens > 1:
            res.tpot_s = (end - first) * scale / (tokens - 1)
    res.e2e_s = (end - start) * scale
    return res


_JSON = {"Content-Type": "application/json"}


async def replay(
    url: str | Sequence[str],
    records: Sequence[TraceRecord],
    time_scale: float = 1.0,
    model: str = "prfaas",
    seed: int = 0,
    on_result: Callable[[Result], None] | None = None,
    max_connections: int = 2048,
    bodies: Sequence[bytes] | None = None,
    abort_when: Callable[[Sequence[Result]], bool] | None = None,
) -> list[Result]:
    """Send every request at ``arrival_s / time_scale`` wall seconds after the start; wait for all. Several
    ``url``: request ``i`` goes to ``url[i % n]`` (a round-robin front over router replicas).

    ``bodies`` (from :func:`prepare_bodies`) are built here when not given, before the clock starts.
    ``abort_when`` is asked about 4 times a second (wall) with the results so far (filled in place); once it
    answers True nothing more is sent, requests in flight are cancelled (their connections close, so the
    router cancels both legs) and the unfinished ones come back with status 0."""
    if bodies is None:
        bodies = prepare_bodies(records, seed, model)
    urls = [url] if isinstance(url, str) else list(url)
    if not urls:
        raise ValueError("replay needs at least one URL")
    results = [
        Result(i, rec.input_tokens, rec.uncached_tokens, rec.output_tokens, arrival_s=rec.arrival_s)
        for i, rec in enumerate(records)
    ]
    connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=max_connections)
    timeout = aiohttp.ClientTimeout(total=600.0, sock_connect=10.0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as session:
        tasks: list[asyncio.Task[Result]] = []

        async def send_all() -> None:
            start = time.perf_counter()
            for i, rec in enumerate(records):
                delay = rec.arrival_s / time_scale - (time.perf_counter() - start)
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(_one(session, urls[i % len(urls)], results[i], bodies[i], time_scale))
                if on_result is not None:
                    task.add_done_callback(lambda t: on_result(t.result()) if not t.cancelled() else None)
                tasks.append(task)
            await asyncio.gather(*tasks)

        sender = asyncio.create_task(send_all())
        while not sender.done():
            await asyncio.wait({sender}, timeout=0.25)
            if abort_when is not None and not sender.done() and abort_when(results):
                sender.cancel()
                for task in tasks:
                    task.cancel()
                await asyncio.gather(sender, *tasks, return_exceptions=True)
                for i, res in enumerate(results):
                    if i >= len(tasks) or tasks[i].cancelled():
                        res.status, res.error, res.done = 0, "cancelled: the replay stopped early", True
                break
        if not sender.cancelled():
            sender.result()  # re-raise a failure of the sender itself
    return results


async def sample_egress(
    urls: Sequence[str],
    time_scale: float,
    stop: asyncio.Event,
    samples: list[float],
    metric: str = EGRESS,
    stamps: list[float] | None = None,
) -> None:
    """Link egress (model Gbps) per 1-second *model* window, summed over the link's relays' counters;
    ``stamps`` gets the wall clock (perf_counter) at the end of each window (a busy machine stretches them)."""
    from prfaas_router.state.metrics import sample_sum

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
        last: tuple[float, float] | None = None
        while not stop.is_set():
            total, missed = 0.0, False
            for url in urls:
                try:
                    async with session.get(url) as resp:
                        text = await resp.text()
                except (aiohttp.ClientError, TimeoutError):
                    missed = True  # a window without every relay's counter is no window (it would go negative)
                    break
                total += sample_sum(text, metric) or 0.0
            now = time.perf_counter()
            if not missed and last is not None and now > last[0]:
                samples.append((total - last[1]) * 8 / 1e9 / ((now - last[0]) * time_scale))
                if stamps is not None:
                    stamps.append(now)
            last = None if missed else (now, total)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0 / time_scale)


@dataclass(frozen=True)
class Summary:
    requests: int
    ok: int
    meets_slo: int
    attainment: float
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    routes: dict[str, int]
    misses: dict[str, int] = field(default_factory=dict)
    """Requests that missed the SLO, by why: error, ttft or tpot."""

    def as_json(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "ok": self.ok,
            "meets_slo": self.meets_slo,
            "slo_attainment": round(self.attainment, 4),
            "ttft_p50_s": None if self.ttft_p50_s is None else round(self.ttft_p50_s, 3),
            "ttft_p90_s": None if self.ttft_p90_s is None else round(self.ttft_p90_s, 3),
            "routes": self.routes,
            "slo_misses": self.misses,
        }


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def summarize(results: Sequence[Result], slo: SloSpec) -> Summary:
    ok = [r for r in results if r.status == 200]
    meets = sum(1 for r in results if r.meets(slo))
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    routes: dict[str, int] = {}
    misses: dict[str, int] = {}
    for r in results:
        routes[r.route] = routes.get(r.route, 0) + 1
        why = r.miss_reason(slo)
        if why is not None:
            misses[why] = misses.get(why, 0) + 1
    return Summary(
        len(results),
        len(ok),
        meets,
        meets / len(results) if results else 0.0,
        _quantile(ttfts, 0.5),
        _quantile(ttfts, 0.9),
        routes,
        misses,
    )
