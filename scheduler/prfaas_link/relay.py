"""The link emulator's data path: an asyncio TCP relay shaped to a capacity, a round-trip time and a loss rate.

Each accepted connection (from the decode side) is relayed to the target (the prefill side's KV server). Both
directions are shaped, each by its own :class:`~.shaper.FairShare` (a full-duplex link): a reader takes up to
``chunk_bytes``, waits for its grant of serialisation time, and hands the chunk to a delay line that delivers
it one-way delay (RTT/2) after its serialisation ends. So a transfer of ``B`` bytes takes at least ``B/rate``
plus the propagation delay, concurrent transfers share the rate round-robin, and a long pipe stays full
(chunks in flight do not wait for each other's propagation).

Loss is modelled by its cost, not by corrupting the stream: with probability ``loss`` a chunk is "lost" — it is
sent again (its bytes charged to the link twice) and arrives one RTT later, blocking the chunks behind it like
TCP's in-order delivery. All rates and delays are model values scaled by
:class:`~prfaas_core.launch.emulation.ScaleSettings`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .config import Endpoint, LinkConfig
from .metrics import EgressWindows, LinkMetrics, RecentRate
from .shaper import FairShare, Grant

PACER_LOOKAHEAD_S = 0.010
"""Grants are handed out up to this far ahead of the wire, so timer jitter never idles a busy link (a
capacity change reaches the wire within it); a flow's bytes still never finish before ``bytes/rate``."""
DELAY_LINE_CHUNKS = 256


class LinkFaults(BaseModel):
    """Fault knobs: ``slow_factor`` divides the capacity, ``error_rate`` refuses that fraction of new
    connections (reset at once), ``drop_mid_stream`` cuts that fraction of connections after their first
    delivered chunk, ``die`` stops the link (the CLI process exits with 137)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    slow_factor: float = Field(default=1.0, ge=1.0, le=1e6)
    error_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    drop_mid_stream: float = Field(default=0.0, ge=0.0, le=1.0)
    die: bool = False


class LinkShape(BaseModel):
    """Live shape of the link (``POST /admin/link``): model Gbps, model milliseconds, chunk loss probability."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    capacity_gbps: float = Field(ge=0, le=1e7, description="0 cuts the link: transfers stall until raised.")
    rtt_ms: float = Field(ge=0, le=1e6)
    loss: float = Field(ge=0, lt=1)


class LoopClock:
    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep_until(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        while (left := deadline - loop.time()) > 0:
            await asyncio.sleep(left)


class Direction:
    """One direction of the link: a pacer task hands out grants from a :class:`FairShare`."""

    def __init__(self, clock: LoopClock, rate: float) -> None:
        self.clock = clock
        self.fair = FairShare(rate)
        self._waiters: dict[int, asyncio.Future[Grant]] = {}
        self._kick = asyncio.Event()

    def set_rate(self, rate: float) -> None:
        self.fair.set_rate(rate)
        self._kick.set()

    async def acquire(self, flow: int, nbytes: int) -> Grant:
        fut: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        self._waiters[flow] = fut
        self.fair.request(flow, nbytes)
        self._kick.set()
        try:
            return await fut
        finally:
            if not fut.done() or fut.cancelled():
                self.fair.cancel(flow)
            self._waiters.pop(flow, None)

    async def run(self) -> None:
        while True:
            now = self.clock.now()
            backlog = self.fair.backlog_s(now)
            if backlog > PACER_LOOKAHEAD_S:
                await self.clock.sleep_until(now + backlog - PACER_LOOKAHEAD_S)
                continue
            grant = self.fair.next_grant(now)
            if grant is None:
                self._kick.clear()
                await self._kick.wait()
                continue
            fut = self._waiters.get(grant.flow)
            if fut is not None and not fut.done():
                fut.set_result(grant)


class Link:
    """The relay plus its live settings; ``start()`` listens, ``close()`` stops and cuts every connection."""

    def __init__(self, config: LinkConfig, on_die: Callable[[], None] | None = None) -> None:
        self.config = config
        self.scale = config.scale
        self.clock = LoopClock()
        self.shape = LinkShape(capacity_gbps=config.capacity_gbps, rtt_ms=config.rtt_ms, loss=config.loss)
        self.faults = LinkFaults()
        self.on_die = on_die
        self._rng = random.Random(config.seed)
        self._flows = itertools.count()
        self._recent = RecentRate(lambda: asyncio.get_running_loop().time())
        self.windows = EgressWindows()
        self.metrics = LinkMetrics(config.name, self.utilisation)
        self._conns: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self._pacers: list[asyncio.Task[None]] = []
        self.egress: Direction | None = None
        self.upstream: Direction | None = None
        self.listen: Endpoint | None = None
        self.dead = False

    # --- settings ----------------------------------------------------------------------------------------
    def wire_rate(self) -> float:
        return self.scale.wire_rate_bytes_per_s(self.shape.capacity_gbps) / self.faults.slow_factor

    def one_way_s(self) -> float:
        return self.scale.wall_seconds(self.shape.rtt_ms / 1000.0) / 2

    def utilisation(self) -> float:
        rate = self.wire_rate()
        if rate <= 0:
            return 0.0
        with contextlib.suppress(RuntimeError):
            return self._recent.bytes_per_s() / rate
        return 0.0

    def _apply(self) -> None:
        for direction in (self.egress, self.upstream):
            if direction is not None:
                direction.set_rate(self.wire_rate())
        self.metrics.capacity.set(self.shape.capacity_gbps / self.faults.slow_factor)
        self.metrics.rtt.set(self.shape.rtt_ms / 1000.0)

    def reshape(self, changes: dict[str, Any]) -> LinkShape:
        """Change capacity, RTT or loss mid-run (pydantic ``ValidationError`` on bad values)."""
        self.shape = LinkShape.model_validate({**self.shape.model_dump(), **changes})
        self._apply()
        return self.shape

    def set_faults(self, changes: dict[str, Any]) -> LinkFaults:
        self.faults = LinkFaults.model_validate({**self.faults.model_dump(), **changes})
        self._apply()
        if self.faults.die:
            asyncio.get_running_loop().call_soon(self.die)
        return self.faults

    # --- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> Endpoint:
        self.egress = Direction(self.clock, self.wire_rate())
        self.upstream = Direction(self.clock, self.wire_rate())
        loop = asyncio.get_running_loop()
        self._pacers = [loop.create_task(self.egress.run()), loop.create_task(self.upstream.run())]
        self._apply()
        listen = self.config.listen
        self._server = await asyncio.start_server(self._accept, listen.host, listen.port, backlog=1024)
        self.listen = Endpoint(listen.host, int(self._server.sockets[0].getsockname()[1]))
        return self.listen

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        for task in [*self._conns, *self._pacers]:
            task.cancel()
        await asyncio.gather(*self._conns, *self._pacers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def die(self) -> None:
        self.dead = True
        if self.on_die is not None:
            self.on_die()
            return
        asyncio.get_running_loop().create_task(self.close())

    def snapshot(self) -> dict[str, Any]:
        return {
            "name": self.config.name,
            "listen": str(self.listen) if self.listen else None,
            "target": str(self.config.target),
            **self.shape.model_dump(),
            "wire_rate_bytes_per_s": self.wire_rate(),
            "utilization": self.utilisation(),
            "active_transfers": len(self._conns),
            "scale": {"time_scale": self.scale.time_scale, "byte_scale": self.scale.byte_scale},
            "faults": self.faults.model_dump(),
        }

    # --- data path ---------------------------------------------------------------------------------------
    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.metrics.connections.inc()
        if self.dead or (self.faults.error_rate > 0 and self._rng.random() < self.faults.error_rate):
            self.metrics.drop("refused")
            client_w.transport.abort()
            return
        # The relay runs in a task of its own: close() cancels that, never asyncio's connection handler.
        inner = asyncio.get_running_loop().create_task(self._relay(client_r, client_w))
        self._conns.add(inner)
        self._writers.add(client_w)
        self.metrics.active.set(len(self._conns))
        try:
            await inner
        except asyncio.CancelledError:
            if not inner.cancelled():
                raise
        finally:
            self._conns.discard(inner)
            self._writers.discard(client_w)
            self.metrics.active.set(len(self._conns))

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        target = self.config.target
        try:
            async with asyncio.timeout(self.config.connect_timeout_s):
                target_r, target_w = await asyncio.open_connection(target.host, target.port)
        except (OSError, TimeoutError):
            self.metrics.drop("target_unreachable")
            client_w.transport.abort()
            return
        self._writers.add(target_w)
        drop = self.faults.drop_mid_stream > 0 and self._rng.random() < self.faults.drop_mid_stream
        assert self.egress is not None and self.upstream is not None
        flow_up, flow_down = next(self._flows), next(self._flows)
        up = asyncio.create_task(self._pipe(flow_up, client_r, target_w, self.upstream, self._count_up, False))
        down = asyncio.create_task(self._pipe(flow_down, target_r, client_w, self.egress, self._count_down, drop))
        try:
            done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_EXCEPTION)
            if any(t.exception() is not None for t in done if not t.cancelled()):
                raise ConnectionAbortedError
            await asyncio.gather(up, down)
        except (ConnectionError, asyncio.CancelledError) as exc:
            if not isinstance(exc, asyncio.CancelledError):
                self.metrics.drop("dropped" if drop else "reset")
            for w in (client_w, target_w):
                w.transport.abort()
            for t in (up, down):
                t.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._writers.discard(target_w)
            for w in (client_w, target_w):
                w.close()

    def _count_up(self, nbytes: int, wire_at: float) -> None:
        self.metrics.reverse.inc(self.scale.model_bytes(nbytes))

    def _count_down(self, nbytes: int, wire_at: float) -> None:
        self.metrics.wire.inc(nbytes)
        self.metrics.egress.inc(self.scale.model_bytes(nbytes))
        self._recent.add(nbytes)
        # the window of the chunk's serialisation on the emulated wire, not of the moment this process got round
        # to delivering it: a relay starved of CPU must not show the link carrying more than its rate
        self.windows.add(self.scale.model_seconds(wire_at), self.scale.model_bytes(nbytes))

    async def _pipe(
        self,
        flow: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        direction: Direction,
        count: Callable[[int, float], None],
        drop_after_first: bool,
    ) -> None:
        """Relay ``reader`` to ``writer`` through ``direction``'s shaper; ``count(nbytes, wire_at)`` once a chunk
        is delivered, ``wire_at`` the (loop clock) moment its serialisation on the emulated wire ended."""
        line: asyncio.Queue[tuple[float, float, bytes] | Exception | None] = asyncio.Queue(maxsize=DELAY_LINE_CHUNKS)

        async def shape() -> None:
            while True:
                try:
                    data = await reader.read(self.config.chunk_bytes)
                except ConnectionError as exc:
                    await line.put(exc)
                    return
                if not data:
                    await line.put(None)
                    return
                grant = await direction.acquire(flow, len(data))
                one_way = self.one_way_s()
                wire_at = grant.finish
                deliver_at = grant.finish + one_way
                if self.shape.loss > 0 and self._rng.random() < self.shape.loss:
                    resent = await direction.acquire(flow, len(data))  # the retransmission uses capacity again
                    wire_at = resent.finish
                    deliver_at = resent.finish + 2 * one_way + one_way  # noticed one RTT late, then propagates
                await line.put((deliver_at, wire_at, data))

        shaper = asyncio.create_task(shape())
        try:
            while True:
                item = await line.get()
                if item is None:
                    break
                if isinstance(item, Exception):
                    raise item
                deliver_at, wire_at, data = item
                await self.clock.sleep_until(deliver_at)
                writer.write(data)
                await writer.drain()
                count(len(data), wire_at)
                if drop_after_first:
                    raise ConnectionAbortedError("drop_mid_stream fault")
            await shaper
            if writer.can_write_eof():
                writer.write_eof()
        finally:
            shaper.cancel()
            await asyncio.gather(shaper, return_exceptions=True)
