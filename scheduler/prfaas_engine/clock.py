"""Time as a parameter: the engine and link read "now" and sleep through a :class:`Clock` they are given."""

from __future__ import annotations

import asyncio
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Sleep at least ``seconds``."""
        ...


class LoopClock:
    """The running event loop's monotonic clock; ``sleep`` never returns early (timers may fire a bit early)."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        await asyncio.sleep(seconds)
        while (left := end - loop.time()) > 0:
            await asyncio.sleep(left)
