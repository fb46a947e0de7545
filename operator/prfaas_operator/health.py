"""The operator's liveness and readiness, as the kubelet probes them (``/healthz``, ``/readyz`` beside
``/metrics``).

Live means the reconcile loop makes progress. The cycle loop beats every time it goes round (every tick,
``tick_s``, on the leader and on a standby alike): a tick that never returns (an await that never resolves, a
deadlock) or an event loop blocked by synchronous code stops the beats, and after ``stall_s`` without one the
operator is not live (HTTP 503 with the reason; the kubelet restarts the pod). The operator's own tasks (Lease,
cycle, re-list) must be running: one that ended is not live either. The checks run on the metrics server's
thread, so a blocked event loop cannot stop them from answering.

A slow or unreachable API server or Prometheus does not by itself fail liveness (a restart would not help): each
call is bounded by its timeout and retries (an API call about a minute at worst, a Prometheus query 5 s), objects
finish, and the loop goes on. Only calls that hang past their bounds for longer than ``stall_s`` would. A watch
that silently misses events is repaired by the periodic re-list.

Ready means the operator has started and its cycle loop has gone round once (its cache is being served).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class Health:
    stall_s: float
    """Without a beat of the cycle loop for this long, the operator is not live."""
    clock: Callable[[], float] = time.monotonic
    _beat: float | None = None
    _tasks: Sequence[asyncio.Task[None]] = ()
    _stopping: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def beat(self) -> None:
        """The cycle loop went round (called on the event loop)."""
        now = self.clock()
        with self._lock:
            self._beat = now

    def watch(self, tasks: Sequence[asyncio.Task[None]]) -> None:
        """The long-running tasks that must not end while the operator runs."""
        self._tasks = tuple(tasks)

    def stopping(self) -> None:
        """Shutting down: tasks end on purpose."""
        self._stopping = True

    def live(self) -> tuple[bool, str]:
        """(live, why) for ``/healthz``."""
        with self._lock:
            beat = self._beat
        if not self._stopping:
            for task in self._tasks:
                if task.done():
                    exc = None if task.cancelled() else task.exception()
                    why = f": {type(exc).__name__}: {exc}" if exc is not None else ""
                    return False, f"task {task.get_name()} has ended{why}"
        if beat is None:
            return True, "starting"
        idle = self.clock() - beat
        if idle > self.stall_s:
            return False, (
                f"the reconcile loop has made no progress for {idle:.1f} s (limit {self.stall_s:g} s): a tick is "
                "stuck or the event loop is blocked"
            )
        return True, f"the reconcile loop went round {idle:.1f} s ago"

    def ready(self) -> tuple[bool, str]:
        """(ready, why) for ``/readyz``."""
        live, why = self.live()
        if not live:
            return False, why
        with self._lock:
            started = self._beat is not None
        return (True, "ok") if started else (False, "starting: the reconcile loop has not gone round yet")
