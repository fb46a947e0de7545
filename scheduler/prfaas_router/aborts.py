"""Cutting short the legs in flight to a side that turned unready: a remote whose status says it has no ready
instance (the router), an engine after its consecutive failed probes (the gateway). Without this, a request
already dispatched to a frozen engine waits out the leg's full timeout before falling back; with it, the leg is
cancelled at the refresh that saw the change (within seconds) and the caller re-routes it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


def remote_side(name: str) -> str:
    return f"remote:{name}"


def engine_side(name: str) -> str:
    return f"engine:{name}"


class SideLost(Exception):
    """The side a leg was sent to turned unready while the leg was in flight."""


class Aborts:
    """Legs in flight by the side they went to; :meth:`abort` cancels every one of a side."""

    def __init__(self) -> None:
        self._waiting: dict[str, set[asyncio.Future[str]]] = {}

    async def run(self, side: str, leg: Awaitable[T]) -> T:
        """Await ``leg``; SideLost (with the reason) if ``side`` is aborted first (the leg is cancelled)."""
        lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        waiting = self._waiting.setdefault(side, set())
        waiting.add(lost)
        task = asyncio.ensure_future(leg)
        try:
            racing: set[asyncio.Future[Any]] = {task, lost}
            done, _ = await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
            if task in done:
                return task.result()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise SideLost(lost.result())
        finally:
            if not task.done():
                task.cancel()
            waiting.discard(lost)
            if not lost.done():
                lost.cancel()

    def abort(self, side: str, why: str) -> int:
        """Cancel the legs in flight to ``side``; how many there were."""
        waiting = self._waiting.get(side, set())
        n = 0
        for lost in list(waiting):
            if not lost.done():
                lost.set_result(why)
                n += 1
        return n

    def in_flight(self, side: str) -> int:
        return len(self._waiting.get(side, ()))
