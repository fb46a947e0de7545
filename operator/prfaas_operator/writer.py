"""Status writes: a merge patch of the status subresource, sent only when something changed."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from prfaas_core.api import ApiModel, Condition
from prfaas_core.names import GROUP_VERSION

from .kube import ApiError, KubeApi, api_path
from .registry import PLURALS, Entry, World
from .status import QUIET_RULES, STATUS_HEARTBEAT_S, changed_fields, set_condition, status_patch


class StatusWriter:
    """The one place status is written, and the one change detector: a patch is sent only when a field moved
    by more than its kind's :data:`~.status.QUIET_RULES` allow (so a fleet at rest writes nothing but a
    heartbeat every ``heartbeat_s``)."""

    def __init__(self, api: KubeApi, world: World, heartbeat_s: float = STATUS_HEARTBEAT_S) -> None:
        self.api = api
        self.world = world
        self.heartbeat_s = heartbeat_s
        self.writes = 0
        self.reasons: Counter[str] = Counter()
        """Writes by what moved (``Kind.field``, each changed field of each write): where a busy status comes from."""

    async def write(self, entry: Entry, typed: ApiModel) -> bool:
        """Patch the fields set on ``typed`` (the kind's status model; they replace the old ones); False when
        nothing changed or the object is gone."""
        status = status_patch(typed)
        moved = changed_fields(entry.status, status, QUIET_RULES.get(entry.kind), self.heartbeat_s)
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
