"""Status writes: a merge patch of the status subresource, sent only when something changed."""

from __future__ import annotations

import zlib
from collections import Counter, deque
from collections.abc import Callable, Sequence

from prfaas_core.api import ApiModel, Condition
from prfaas_core.names import GROUP_VERSION

from .kube import ApiError, KubeApi, api_path
from .registry import PLURALS, Entry, World
from .status import QUIET_RULES, STATUS_HEARTBEAT_S, changed_fields, set_condition, status_patch

HEARTBEAT_CYCLES = 20
"""By default (``--status-heartbeat-cycles``) a heartbeat is at least this many of the slowest recent cycles
apart: when a cycle takes longer than ``heartbeat_s / HEARTBEAT_CYCLES`` (thousands of objects), the heartbeat
stretches with it, so that at most 1 / HEARTBEAT_CYCLES of the objects rewrite a still-fresh timestamp in any one
cycle (at a 300-s heartbeat and a 300-s cycle every object had rewritten one every cycle)."""
RECENT_CYCLES = 32
"""How many recent cycles' durations the stretch is taken over (their maximum)."""


def heartbeat_phase(entry: Entry) -> float:
    """A fixed fraction in [0, 1) per object (a hash of its kind, namespace and name; the same in every
    operator process): how far past the heartbeat its own falls, so that objects whose timestamps were written
    in one cycle (a cold start, a restart) do not all heartbeat in one later cycle."""
    return zlib.crc32(f"{entry.kind}/{entry.namespace or ''}/{entry.name}".encode()) / 2**32


class StatusWriter:
    """The one place status is written, and the one change detector: a patch is sent only when a field moved
    by more than its kind's :data:`~.status.QUIET_RULES` allow (so a fleet at rest writes nothing but a
    heartbeat). An object's heartbeat is due when its still-fresh timestamp is ``interval * (1 + phase)`` old:
    ``interval`` is ``heartbeat_s``, or ``heartbeat_cycles`` (:data:`HEARTBEAT_CYCLES`) of the slowest recent
    cycles (:meth:`cycle_took`) if that is longer, and ``phase`` the object's own fixed offset
    (:func:`heartbeat_phase`), so heartbeats are spread over cycles instead of coming all in one."""

    def __init__(
        self,
        api: KubeApi,
        world: World,
        heartbeat_s: float = STATUS_HEARTBEAT_S,
        heartbeat_cycles: int = HEARTBEAT_CYCLES,
    ) -> None:
        self.api = api
        self.world = world
        self.heartbeat_s = heartbeat_s
        self.heartbeat_cycles = heartbeat_cycles
        self.writes = 0
        self.reasons: Counter[str] = Counter()
        """Writes by what moved (``Kind.field``, each changed field of each write): where a busy status comes from."""
        self._cycles: deque[float] = deque(maxlen=RECENT_CYCLES)

    def cycle_took(self, seconds: float) -> None:
        """The wall time of a cycle that just ended (the cycle loop reports every one)."""
        self._cycles.append(seconds)

    @property
    def interval_s(self) -> float:
        """The heartbeat interval in force (before each object's phase)."""
        return max(self.heartbeat_s, self.heartbeat_cycles * max(self._cycles, default=0.0))

    def heartbeat_of(self, entry: Entry) -> float:
        """How old ``entry``'s still-fresh timestamps may grow before they are rewritten alone."""
        return self.interval_s * (1.0 + heartbeat_phase(entry))

    async def write(self, entry: Entry, typed: ApiModel) -> bool:
        """Patch the fields set on ``typed`` (the kind's status model; they replace the old ones); False when
        nothing changed or the object is gone."""
        status = status_patch(typed)
        moved = changed_fields(entry.status, status, QUIET_RULES.get(entry.kind), self.heartbeat_of(entry))
        if not moved:
            return False
        path = api_path(GROUP_VERSION, PLURALS[entry.kind], entry.namespace, entry.name, "status")
        try:
            await self.api.patch(path, {"status": status})
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        self.writes += 1
        self.reasons.update(f"{entry.kind}.{field}" for field in moved)
        merged = {**entry.status, **{k: v for k, v in status.items()}}
        entry.body = {**entry.body, "status": {k: v for k, v in merged.items() if v is not None}}
        self.world.update_status(entry.kind, entry.key, status)
        return True

    async def write_paused(
        self,
        entry: Entry,
        status_type: Callable[..., ApiModel],
        conditions: Sequence[Condition],
        now_s: float,
        message: str = "reconciliation is paused",
    ) -> bool:
        """The ``prfaas.io/paused`` step every reconcile starts with: set the Paused condition and write only it
        (``status_type`` is the kind's status model); False when nothing changed."""
        conds = set_condition(conditions, "Paused", True, "PausedByAnnotation", message, now_s, entry.generation)
        return await self.write(entry, status_type(conditions=conds))
