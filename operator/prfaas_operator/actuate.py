"""The Kubernetes actuator: drain, then flip — by relabelling pods or by scaling two workloads.

*Relabel* (one shared workload, engines run ``kv_both``): a drain sets ``prfaas.io/draining=true`` and the
``prfaas.io/drain-started`` annotation on the pod (routers read the draining list from the router config
and send it no new work); the flip sets ``prfaas.io/role`` to the new role, removes the drain marks and
stamps ``prfaas.io/last-role-flip`` (the cooldown survives restarts through it). A flip aborted at its drain
timeout (requests still in flight) removes the drain marks and leaves the role as it was.

*Scale* (separate prefill and decode workloads): the drain is the same, plus a low
``controller.kubernetes.io/pod-deletion-cost`` so a Deployment removes the drained pod first; the flip stamps
``last-role-flip`` on the drained pod (it is retired: no longer counted, never flipped again) and then writes
both workloads' replica counts through their ``scale`` subresource — the receiving one up first, the giving one
down second — as *absolute* values (idempotent on retry) computed from the counts read just before. The
retirement carries those values (``prfaas.io/scale-targets``) and they are removed once written: a flip
interrupted in between (a crash, the API refusing) is finished by the next reconcile or resync
(:meth:`Actuator.resume`), never lost and never applied twice.
The operator is the one writer of those replica counts; no HPA may target the same workloads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from prfaas_core.api import PDCluster, WorkloadRef
from prfaas_core.names import (
    ANNOTATION_DRAIN_STARTED,
    ANNOTATION_LAST_FLIP,
    ANNOTATION_POD_DELETION_COST,
    ANNOTATION_SCALE_TARGETS,
    LABEL_DRAINING,
    LABEL_ROLE,
)
from prfaas_core.policy.role_types import RoleDecision

from .kube import ApiError, JsonDict, KubeApi, api_path
from .registry import World
from .status import iso

DELETION_COST = ANNOTATION_POD_DELETION_COST
WORKLOAD_PLURALS = {"Deployment": "deployments", "StatefulSet": "statefulsets", "LeaderWorkerSet": "leaderworkersets"}


def workload_path(ref: WorkloadRef, namespace: str, sub: str | None = None) -> str:
    return api_path(ref.api_version, WORKLOAD_PLURALS[ref.kind], namespace, ref.name, sub)


class KubeActuator:
    """Applies one PD cluster's decisions; every write goes through the retrying client."""

    def __init__(self, api: KubeApi, world: World) -> None:
        self.api = api
        self.world = world

    async def _patch_pod(self, namespace: str, name: str, labels: dict[str, Any], annotations: dict[str, Any]) -> None:
        body: JsonDict = {"metadata": {}}
        if labels:
            body["metadata"]["labels"] = labels
        if annotations:
            body["metadata"]["annotations"] = annotations
        patched = await self.api.patch(api_path("v1", "pods", namespace, name), body)
        if patched.get("metadata"):
            self.world.upsert_pod(patched)  # our own write is visible to the next cycle at once

    async def assign(self, namespace: str, roles: Iterable[tuple[str, str]]) -> None:
        """Give unlabelled instances their first role (no drain: they serve nothing yet)."""
        for name, role in roles:
            await self._patch_pod(namespace, name, {LABEL_ROLE: role}, {})

    async def apply(self, pd: PDCluster, decision: RoleDecision, now_s: float) -> None:
        namespace = pd.metadata.namespace or "default"
        scale = pd.spec.role_assignment.mode == "Scale"
        stamp = iso(now_s)
        for name in decision.drain:
            annotations: dict[str, Any] = {ANNOTATION_DRAIN_STARTED: stamp}
            if scale:
                annotations[DELETION_COST] = "-1000"
            await self._patch_pod(namespace, name, {LABEL_DRAINING: "true"}, annotations)
        for name in decision.undrain:  # a flip aborted at its drain timeout: the pod serves on in its role
            undo: dict[str, Any] = {ANNOTATION_DRAIN_STARTED: None}
            if scale:
                undo[DELETION_COST] = None
            await self._patch_pod(namespace, name, {LABEL_DRAINING: None}, undo)
        if not decision.flip:
            return
        if not scale:
            for name, role in decision.flip:
                await self._patch_pod(
                    namespace,
                    name,
                    {LABEL_ROLE: role, LABEL_DRAINING: None},
                    {ANNOTATION_LAST_FLIP: stamp, ANNOTATION_DRAIN_STARTED: None},
                )
            return
        workloads = pd.spec.workloads
        assert workloads.prefill is not None and workloads.decode is not None  # the spec's CEL rule
        grow, shrink = (
            (workloads.decode, workloads.prefill)
            if decision.action == "FlipToDecode"
            else (workloads.prefill, workloads.decode)
        )
        # the targets come from the workloads' replica counts, not from the pods that happen to exist (a pod
        # being recreated would otherwise cost an instance); read before anything changes, so a failed read
        # leaves the drained instance pending and the next cycle tries again
        k = len(decision.flip)
        targets = [
            (grow, await self._replicas(grow, namespace) + k),
            (shrink, await self._replicas(shrink, namespace) - k),
        ]
        plan = json.dumps(
            [{"apiVersion": r.api_version, "kind": r.kind, "name": r.name, "replicas": max(n, 0)} for r, n in targets]
        )
        names = [name for name, _ in decision.flip]
        for name in names:  # retire first, with the targets: an interruption after this is resumed, not lost
            await self._patch_pod(namespace, name, {}, {ANNOTATION_LAST_FLIP: stamp, ANNOTATION_SCALE_TARGETS: plan})
        await self._write_targets(namespace, plan, names)

    async def _write_targets(self, namespace: str, plan: str, pods: list[str]) -> None:
        """The absolute replica counts (up first, so capacity never dips below the target), then the marks off."""
        for t in json.loads(plan):
            ref = WorkloadRef(api_version=t["apiVersion"], kind=t["kind"], name=t["name"])
            await self.api.patch(workload_path(ref, namespace, "scale"), {"spec": {"replicas": int(t["replicas"])}})
        for name in pods:
            try:
                await self._patch_pod(namespace, name, {}, {ANNOTATION_SCALE_TARGETS: None})
            except ApiError as exc:
                if exc.status != 404:  # the workload already removed the retired pod
                    raise

    async def resume(self, namespace: str, pods: Iterable[JsonDict]) -> list[str]:
        """Finish the flips whose retirement was written but not their replica counts; the pods resumed."""
        done = []
        for pod in pods:
            meta = pod.get("metadata") or {}
            plan = (meta.get("annotations") or {}).get(ANNOTATION_SCALE_TARGETS)
            if plan:
                await self._write_targets(namespace, plan, [str(meta["name"])])
                done.append(str(meta["name"]))
        return done

    async def scale_counts(self, pd: PDCluster) -> tuple[int, int] | None:
        """Scale mode: the (prefill, decode) replica counts the two workloads ask for now (None: unreadable)."""
        workloads, namespace = pd.spec.workloads, pd.metadata.namespace or "default"
        if pd.spec.role_assignment.mode != "Scale" or workloads.prefill is None or workloads.decode is None:
            return None
        try:
            return await self._replicas(workloads.prefill, namespace), await self._replicas(workloads.decode, namespace)
        except ApiError:
            return None

    async def _replicas(self, ref: WorkloadRef, namespace: str) -> int:
        """The workload's desired replica count, from its ``scale`` subresource."""
        scale = await self.api.get(workload_path(ref, namespace, "scale"))
        if scale is None:
            raise ApiError(404, "NotFound", f"{ref.kind} {namespace}/{ref.name} not found")
        return int((scale.get("spec") or {}).get("replicas") or 0)
