"""Continuous batching: a waiting queue, a running batch of at most ``max_batch`` requests, and one step loop.

Each step runs one chunk of the oldest unfinished prefill (if any) together with one decode token for every
decoding request, and takes ``chunk time + decode step(b)`` model seconds (:mod:`.timing`), divided by the
time scale on the wall clock. Admission is first come, first served, and needs a free batch slot and free KV
blocks (``ceil((prompt + max_tokens)/block)``). The prefix cache is consulted at admission (uncached length
sets the prefill time) and filled when a prefill ends.

Legs (:mod:`.disagg`): a *produce* leg ends after its prefill with one token and leaves its prompt's blocks
held in the :class:`~.kv_transfer.KvStore` until a decode pulls them or they expire; a *consume* leg holds
blocks while it pulls the KV (counted as waiting, like vLLM's WAITING_FOR_REMOTE_KVS), then joins the batch
for decode only.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prfaas_core.capacity.kv import whole_blocks
from prfaas_core.launch.emulation import ScaleSettings
from prfaas_core.request.tokens import block_hashes, output_token

from .clock import Clock
from .config import EngineConfig
from .disagg import CONSUME_LEGS, PRODUCE_LEGS, ConsumeNixl, Leg, ProduceBootstrap, ProduceNixl
from .faults import FaultInjector
from .kv_transfer import HeldKv, KvStore, KvTransferError
from .metrics import EngineMetrics
from .prefix_cache import PrefixCache
from .timing import ServiceTimes, chunk_ends


def kv_pull_tokens(prompt_tokens: int, block_size: int, cached_tokens: int = 0) -> int:
    """Tokens' worth of KV a pull moves: whole blocks, as vLLM's NixlConnector reads block descriptors (measured
    on real engines across a veth: a 129-token prompt moves two 128-token blocks, ``tests/real/test_real_netns.py``),
    less the leading blocks the decode already holds in its prefix cache (``cached_tokens``, whole blocks: vLLM
    pulls only the blocks it lacks)."""
    return max(1, whole_blocks(prompt_tokens, block_size) - cached_tokens // block_size) * block_size


class EngineBusy(Exception):
    """The waiting queue is full (HTTP 503)."""


class RequestTooLarge(ValueError):
    """The request can never fit this instance's KV cache or model length (HTTP 400)."""


@dataclass(frozen=True)
class TokenEvent:
    index: int
    token_id: int
    text: str


@dataclass(frozen=True)
class DoneEvent:
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    kv_transfer_params: dict[str, Any] | None = None


@dataclass(frozen=True)
class FailedEvent:
    status: int
    message: str


Event = TokenEvent | DoneEvent | FailedEvent
KvLoader = Callable[["EngineRequest"], Awaitable[None]]
"""Pulls a consume leg's KV; raises :class:`KvTransferError`."""


@dataclass(eq=False)
class EngineRequest:
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    leg: Leg
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    arrival: float = 0.0
    hashes: list[bytes] = field(default_factory=list)
    cache_salt: str | None = None
    blocks: int = 0
    cached_tokens: int = 0
    uncached_tokens: int = 0
    prefill_chunks: list[int] = field(default_factory=list)
    prefill_done: int = 0
    phase: str = "new"
    output_tokens: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    block_ids: tuple[int, ...] = ()
    finished: bool = False

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)


class EngineCore:
    """The scheduler of one emulated instance; ``run()`` is its step loop."""

    def __init__(
        self,
        config: EngineConfig,
        clock: Clock,
        metrics: EngineMetrics,
        store: KvStore,
        faults: FaultInjector,
        kv_params: Callable[[EngineRequest], dict[str, Any]],
        load_kv: KvLoader,
    ) -> None:
        self.config = config
        self.scale: ScaleSettings = config.scale
        self.clock = clock
        self.metrics = metrics
        self.store = store
        self.faults = faults
        self.kv_params = kv_params
        self.load_kv = load_kv
        self.times = ServiceTimes(config.hardware_profile)
        self.kv_model = config.kv_model
        self.prefix_cache = PrefixCache(config.prefix_cache_blocks, config.block_tokens, self.kv_model.recurrent)
        self.waiting: deque[EngineRequest] = deque()
        self.loading: set[EngineRequest] = set()
        self.running: list[EngineRequest] = []
        self.used_blocks = 0
        self._block_ids = itertools.count()
        self._wake = asyncio.Event()
        self._load_tasks: dict[EngineRequest, asyncio.Task[None]] = {}
        self.steps = 0

    # --- intake ------------------------------------------------------------------------------------------
    def blocks_needed(self, prompt_tokens: int, max_tokens: int) -> int:
        return math.ceil((prompt_tokens + max_tokens) / self.config.block_size_tokens)

    def submit(self, req: EngineRequest) -> None:
        """Queue a request and admit what fits now; :class:`EngineBusy` when the waiting queue is full."""
        self._admit()
        if len(self.waiting) >= self.config.max_waiting:
            raise EngineBusy(f"the waiting queue is full ({self.config.max_waiting} requests)")
        total = req.prompt_tokens + req.max_tokens
        if total > self.config.max_model_len:
            raise RequestTooLarge(
                f"This model's maximum context length is {self.config.max_model_len} tokens. However, you "
                f"requested {total} tokens ({req.prompt_tokens} in the messages, {req.max_tokens} in the "
                "completion). Please reduce the length of the messages or completion."
            )
        req.blocks = self.blocks_needed(req.prompt_tokens, req.max_tokens)
        if req.blocks > self.config.kv_cache_blocks:
            raise RequestTooLarge(
                f"the request needs {req.blocks} KV blocks but the instance has {self.config.kv_cache_blocks}"
            )
        req.arrival = self.clock.now()
        req.phase = "waiting"
        self.waiting.append(req)
        self._admit()
        self._update_gauges()
        self._wake.set()

    def abort(self, req: EngineRequest) -> None:
        """Forget a request whose client went away; frees its blocks."""
        if req.finished:
            return
        if req in self.waiting:
            self.waiting.remove(req)
            if req.phase == "ready":  # a consume leg whose KV arrived holds its blocks while it waits
                self.used_blocks -= req.blocks
        elif req in self.loading:
            self.loading.discard(req)
            task = self._load_tasks.pop(req, None)
            if task is not None:
                task.cancel()
            self.used_blocks -= req.blocks
        elif req in self.running:
            self.running.remove(req)
            self.used_blocks -= req.blocks
        req.finished = True
        self.metrics.finished("abort")
        self._update_gauges()

    @property
    def in_flight(self) -> int:
        return len(self.waiting) + len(self.loading) + len(self.running)

    # --- admission ---------------------------------------------------------------------------------------
    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.config.batch_limit:
            req = self.waiting[0]
            if req.phase != "ready" and self.used_blocks + req.blocks > self.config.kv_cache_blocks:
                break
            self.waiting.popleft()
            if req.phase == "ready":  # a consume leg whose KV arrived: blocks already held
                req.phase = "decode"
                self.running.append(req)
                continue
            self.used_blocks += req.blocks
            self.metrics.queue_time_l.observe(self.scale.model_seconds(self.clock.now() - req.arrival))
            req.hashes = block_hashes(req.prompt_ids, self.config.block_tokens, req.cache_salt)
            if isinstance(req.leg, CONSUME_LEGS):
                if isinstance(req.leg, ConsumeNixl):  # vLLM pulls only the blocks its own prefix cache lacks
                    req.cached_tokens = self.prefix_cache.match(req.hashes, req.prompt_tokens, pulling=True)
                    self.metrics.prefix_queries_l.inc(req.prompt_tokens)
                    self.metrics.prefix_hits_l.inc(req.cached_tokens)
                req.phase = "loading"
                self.loading.add(req)
                self._load_tasks[req] = asyncio.get_running_loop().create_task(self._load(req))
                continue
            req.cached_tokens = self.prefix_cache.match(req.hashes, req.prompt_tokens)
            self.metrics.prefix_queries_l.inc(req.prompt_tokens)
            self.metrics.prefix_hits_l.inc(req.cached_tokens)
            req.uncached_tokens = req.prompt_tokens - req.cached_tokens
            req.prefill_chunks = chunk_ends(req.uncached_tokens, self.config.prefill_chunk_tokens)
            req.phase = "prefill"
            self.running.append(req)

    async def _load(self, req: EngineRequest) -> None:
        try:
            await self.load_kv(req)
        except KvTransferError as exc:
            self._fail(req, exc.status, exc.message)
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug or an unexpected transport error: fail the request, keep serving
            self._fail(req, 500, f"KV load failed: {exc!r}")
            return
        finally:
            self._load_tasks.pop(req, None)
        if req.finished:
            return
        self.loading.discard(req)
        self.prefix_cache.insert(req.hashes, req.prompt_tokens)
        # as vLLM counts it: the prompt tokens its own prefix cache held (matched on admission: the blocks it did
        # not pull), and the rest came by the connector
        own_hit = req.cached_tokens
        self.metrics.prompt_tokens_l.inc(req.prompt_tokens)
        self.metrics.prompt_by_source["local_cache_hit"].inc(own_hit)
        # a hybrid (linear layers) pulls the state after N-1 tokens and computes the last one itself (vLLM 0.32)
        computed = 1 if self.kv_model.recurrent and req.prompt_tokens > own_hit else 0
        self.metrics.prompt_by_source["external_kv_transfer"].inc(req.prompt_tokens - own_hit - computed)
        if computed:
            self.metrics.prompt_by_source["local_compute"].inc(computed)
        # what vLLM 0.32 reports in the answer's usage on a decode leg: the prefill side's reuse when the handle
        # names it, else its own count, every prompt token (they all came by the connector)
        remote = getattr(req.leg, "remote_cached_tokens", None)
        req.cached_tokens = remote if remote is not None else req.prompt_tokens
        req.phase = "ready"
        self.waiting.appendleft(req)
        self._update_gauges()
        self._wake.set()

    def _fail(self, req: EngineRequest, status: int, message: str) -> None:
        if req.finished:
            return
        self.loading.discard(req)
        if req in self.running:
            self.running.remove(req)
        self.used_blocks -= req.blocks
        req.finished = True
        self.metrics.finished("error")
        req.events.put_nowait(FailedEvent(status, message))
        self._update_gauges()
        self._wake.set()

    # --- the step loop -----------------------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            self._admit()
            self._update_gauges()
            prefill = next((r for r in self.running if r.phase == "prefill"), None)
            decoders = [r for r in self.running if r.phase == "decode"]
            if prefill is None and not decoders:
                self._wake.clear()
                await self._wake.wait()
                continue
            step_s = self.times.decode_step_s(len(decoders))
            if prefill is not None:
                step_s += self.times.prefill_chunk_s(prefill.prefill_done, prefill.prefill_chunks[0])
            await self.clock.sleep(self.scale.wall_seconds(step_s * self.faults.settings.slow_factor))
            self.steps += 1
            now = self.clock.now()
            if prefill is not None and not prefill.finished:
                prefill.prefill_done = prefill.prefill_chunks.pop(0)
                if not prefill.prefill_chunks:
                    self._prefill_complete(prefill, now)
            for req in decoders:
                if not req.finished:
                    self._emit(req, now)

    def _prefill_complete(self, req: EngineRequest, now: float) -> None:
        self.prefix_cache.insert(req.hashes, req.prompt_tokens)
        # a hybrid's producer leaves the last token to the decode: vLLM 0.32 counts N-1 prompt tokens (measured)
        left = 1 if self.kv_model.recurrent and isinstance(req.leg, ProduceNixl) else 0
        self.metrics.prompt_tokens_l.inc(req.prompt_tokens - left)
        self.metrics.prompt_by_source["local_compute"].inc(max(0, req.uncached_tokens - left))
        self.metrics.prompt_by_source["local_cache_hit"].inc(req.cached_tokens)
        req.phase = "decode"
        self._emit(req, now)

    def _emit(self, req: EngineRequest, now: float) -> None:
        token_id, text = output_token(req.output_tokens)
        req.events.put_nowait(TokenEvent(req.output_tokens, token_id, text))
        req.output_tokens += 1
        self.metrics.generation_tokens_l.inc()
        if req.first_token_at is None:
            req.first_token_at = now
            self.metrics.ttft_l.observe(self.scale.model_seconds(now - req.arrival))
        else:
            assert req.last_token_at is not None
            self.metrics.inter_token_l.observe(self.scale.model_seconds(now - req.last_token_at))
        req.last_token_at = now
        if isinstance(req.leg, PRODUCE_LEGS) or req.output_tokens >= req.max_tokens:
            self._finish(req, now)

    def _finish(self, req: EngineRequest, now: float) -> None:
        self.running.remove(req)
        req.finished = True
        params: dict[str, Any] | None = None
        if isinstance(req.leg, PRODUCE_LEGS):
            try:
                params = self._hold_kv(req, now)
            except KvTransferError as exc:
                self.metrics.finished("error")
                req.events.put_nowait(FailedEvent(exc.status, exc.message))
                self._update_gauges()
                return
        else:
            self.used_blocks -= req.blocks
        self.metrics.e2e_l.observe(self.scale.model_seconds(now - req.arrival))
        # vLLM's per-request mean: decode time over the tokens after the first (0 for a single token)
        decode_s = now - req.first_token_at if req.first_token_at is not None else 0.0
        mean_s = decode_s / (req.output_tokens - 1) if req.output_tokens > 1 else 0.0
        self.metrics.request_tpot_l.observe(self.scale.model_seconds(mean_s))
        self.metrics.finished("length")
        req.events.put_nowait(
            DoneEvent("length", req.prompt_tokens, req.output_tokens, req.cached_tokens, kv_transfer_params=params)
        )
        self._update_gauges()

    def _hold_kv(self, req: EngineRequest, now: float) -> dict[str, Any] | None:
        """Keep the prompt's KV for the remote decode; the blocks stay used until pulled or expired."""
        # whole blocks (a hybrid: of N-1 tokens, plus its recurrent state), as vLLM's NixlConnector moves them
        kv, block, prompt_tokens = self.kv_model, self.config.block_tokens, req.prompt_tokens
        model_bytes = kv.pulled_kv_bytes(prompt_tokens)
        n_blocks = max(1, math.ceil(prompt_tokens / block))
        req.block_ids = tuple(next(self._block_ids) for _ in range(n_blocks))
        if isinstance(req.leg, ProduceBootstrap):
            key = KvStore.room_key(req.leg.room)
        else:
            key = KvStore.nixl_key(req.block_ids)
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.used_blocks -= req.blocks
                self._update_gauges()
                self._wake.set()

        held = HeldKv(
            key=key,
            wire_bytes=self.scale.wire_bytes(model_bytes),
            model_bytes=model_bytes,
            expires_at=now + self.config.kv_timeout_s,
            release=release,
            block_ids=req.block_ids,
            # a decode that holds the leading ``skip`` blocks pulls the rest and, for a hybrid, the whole state
            skipped_wire_bytes=lambda skip: self.scale.wire_bytes(kv.pulled_kv_bytes(prompt_tokens, skip * block)),
        )
        try:
            self.store.hold(held)
        except KvTransferError:
            release()
            raise
        self._update_gauges()
        return self.kv_params(req) if isinstance(req.leg, ProduceNixl) else None

    def _update_gauges(self) -> None:
        self.metrics.running_l.set(len(self.running))
        self.metrics.waiting_l.set(len(self.waiting) + len(self.loading))
        self.metrics.kv_usage_l.set(self.used_blocks / self.config.kv_cache_blocks)
        self.metrics.kv_handles.set(len(self.store))

    async def sweep_forever(self, interval_s: float) -> None:
        """Free KV never pulled (the store's timeout), every ``interval_s`` wall seconds."""
        while True:
            await asyncio.sleep(interval_s)
            if self.store.sweep():
                self._update_gauges()

    async def close(self) -> None:
        for task in list(self._load_tasks.values()):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._load_tasks.values(), return_exceptions=True)
        self.store.release_all()
