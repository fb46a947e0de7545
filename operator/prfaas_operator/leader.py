"""One active replica through a coordination.k8s.io/v1 Lease (acquire, renew, release).

kopf's peering only pauses operators and gives no per-object locks, so the Lease is ours. The protocol is
client-go's: the holder renews every ``renew_s``; another replica takes over only when the Lease record
(holder, renewTime) has not changed for ``duration_s`` *as measured on its own monotonic clock* (no
cross-node clock comparison). Every write is conditional on the Lease's resourceVersion (a merge patch
carrying ``metadata.resourceVersion``), so two contenders cannot both win: the loser gets a 409. A leader
that cannot renew for ``duration_s`` stops acting by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import Callable
from typing import Any

from .kube import ApiError, JsonDict, KubeApi, api_path
from .logs import logger


def micro_time(now_s: float) -> str:
    return dt.datetime.fromtimestamp(now_s, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        name: str,
        identity: str,
        duration_s: float = 15.0,
        renew_s: float = 5.0,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.path = api_path("coordination.k8s.io/v1", "leases", namespace, name)
        self.collection = api_path("coordination.k8s.io/v1", "leases", namespace)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.duration_s, self.renew_s = duration_s, renew_s
        self.on_change = on_change
        self.clock, self.monotonic = clock, monotonic
        self._leader = False
        self._renewed_at = -float("inf")
        self._observed: tuple[Any, Any] | None = None
        self._observed_at = 0.0
        self.log = logger("Lease", namespace, name, identity=identity)

    @property
    def is_leader(self) -> bool:
        return self._leader and self.monotonic() - self._renewed_at < self.duration_s

    def _set(self, leader: bool) -> None:
        if leader:
            self._renewed_at = self.monotonic()
        if leader != self._leader:
            self._leader = leader
            self.log.info("leadership " + ("acquired" if leader else "lost"))
            if self.on_change is not None:
                self.on_change(leader)

    async def step(self) -> bool:
        """One attempt to acquire or renew; returns whether this replica leads now."""
        now = self.clock()
        lease = await self.api.get(self.path)
        if lease is None:
            body: JsonDict = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {
                    "holderIdentity": self.identity,
                    "leaseDurationSeconds": int(self.duration_s),
                    "acquireTime": micro_time(now),
                    "renewTime": micro_time(now),
                    "leaseTransitions": 0,
                },
            }
            try:
                await self.api.create(self.collection, body)
            except ApiError as exc:
                if exc.status != 409:
                    raise
                self._set(False)
                return False
            self._set(True)
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"))
        if record != self._observed:
            self._observed, self._observed_at = record, self.monotonic()
        expired = self.monotonic() - self._observed_at >= self.duration_s
        if holder and holder != self.identity and not expired:
            self._set(False)
            return False
        takeover = holder != self.identity
        patch: JsonDict = {
            "metadata": {"resourceVersion": (lease.get("metadata") or {}).get("resourceVersion")},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.duration_s),
                "renewTime": micro_time(now),
            },
        }
        if takeover:
            patch["spec"]["acquireTime"] = micro_time(now)
            patch["spec"]["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        try:
            updated = await self.api.patch(self.path, patch, retry_conflicts=False)
        except ApiError as exc:
            if exc.status != 409:
                raise
            self._set(False)
            return False
        uspec = updated.get("spec") or {}
        self._observed, self._observed_at = (uspec.get("holderIdentity"), uspec.get("renewTime")), self.monotonic()
        self._set(True)
        return True

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.step()
            except ApiError as exc:
                self.log.warning("lease step failed", error=str(exc))
                if not self.is_leader:
                    self._set(False)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.renew_s)

    async def release(self) -> None:
        """Give the Lease up on shutdown so a standby takes over at once."""
        if not self._leader:
            return
        self._set(False)
        try:
            lease = await self.api.get(self.path)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                rv = (lease.get("metadata") or {}).get("resourceVersion")
                await self.api.patch(
                    self.path,
                    {"metadata": {"resourceVersion": rv}, "spec": {"holderIdentity": None, "renewTime": None}},
                    retry_conflicts=False,
                )
        except ApiError as exc:
            self.log.warning("lease release failed", error=str(exc))
