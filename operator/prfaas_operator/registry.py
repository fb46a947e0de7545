"""The operator's in-memory view of the objects it serves, fed by kopf's watch events.

Every replica keeps it (so a new leader starts warm); only the leader acts on it. Entries hold the raw body
and the parsed model (the core's pydantic types) or the validation problems that kept it from parsing.
Pods are kept only when they carry the ``prfaas.io/pd-cluster`` or ``prfaas.io/prefill-cluster`` label.

Watch streams can drop events (a reconnect gap, an overloaded replica), so the operator also re-lists
periodically; :func:`resync_plan` decides what such a list repairs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prfaas_core.api import InterDCLink, ModelProfile, PDCluster, PrefillCluster
from prfaas_core.api.base import ApiModel
from prfaas_core.names import (
    ANNOTATION_PAUSED,
    KIND_INTER_DC_LINK,
    KIND_MODEL_PROFILE,
    KIND_PD_CLUSTER,
    KIND_PREFILL_CLUSTER,
    LABEL_PD_CLUSTER,
    LABEL_PREFILL_CLUSTER,
)
from prfaas_core.schema.validation import model_issues

from .kube import JsonDict
from .status import read_status

S = TypeVar("S", bound=ApiModel)

MODELS: dict[str, type[ApiModel]] = {
    KIND_PD_CLUSTER: PDCluster,
    KIND_PREFILL_CLUSTER: PrefillCluster,
    KIND_INTER_DC_LINK: InterDCLink,
    KIND_MODEL_PROFILE: ModelProfile,
}
PLURALS = {
    KIND_PD_CLUSTER: "pdclusters",
    KIND_PREFILL_CLUSTER: "prefillclusters",
    KIND_INTER_DC_LINK: "interdclinks",
    KIND_MODEL_PROFILE: "modelprofiles",
}

Key = tuple[str | None, str]


@dataclass
class Entry:
    """One object: its latest body, and its model or why it has none."""

    kind: str
    body: JsonDict
    model: Any = None
    problems: tuple[str, ...] = ()
    _typed: tuple[Any, ApiModel] | None = field(default=None, repr=False, compare=False)

    @property
    def namespace(self) -> str | None:
        ns = self.body.get("metadata", {}).get("namespace")
        return str(ns) if ns else None

    @property
    def name(self) -> str:
        return str(self.body.get("metadata", {}).get("name", ""))

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)

    @property
    def generation(self) -> int | None:
        g = self.body.get("metadata", {}).get("generation")
        return int(g) if isinstance(g, int) else None

    @property
    def status(self) -> JsonDict:
        s = self.body.get("status")
        return s if isinstance(s, dict) else {}

    def read_status(self, model: type[S]) -> S:
        """Its status through the core's model (parsed once per version of the body)."""
        raw = self.body.get("status")
        cached = self._typed
        if cached is not None and cached[0] is raw and type(cached[1]) is model:
            return cached[1]
        typed = read_status(model, self.status)
        self._typed = (raw, typed)
        return typed

    @property
    def paused(self) -> bool:
        return (self.body.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_PAUSED) == "true"

    @property
    def valid(self) -> bool:
        return self.model is not None


def parse(kind: str, body: JsonDict) -> Entry:
    """Parse the spec into the core's model (status is the operator's own output and not validated here)."""
    meta = {
        k: v
        for k, v in (body.get("metadata") or {}).items()
        if k in ("name", "namespace", "labels", "annotations", "generation")
    }
    doc = {"apiVersion": body.get("apiVersion"), "kind": kind, "metadata": meta, "spec": body.get("spec")}
    model, issues = model_issues(MODELS[kind], doc)
    return Entry(kind, body, model, tuple(str(i) for i in issues))


@dataclass
class World:
    objects: dict[str, dict[Key, Entry]] = field(default_factory=lambda: {k: {} for k in MODELS})
    pods: dict[Key, JsonDict] = field(default_factory=dict)
    _pod_index: dict[tuple[str | None, str, str], set[Key]] = field(default_factory=dict)
    version: int = 0
    """Counts the objects' upserts and removals (not the pods', not the operator's own status writes): the cycle
    knows from it that the objects are as they were (:meth:`.cycle.Cycle._due`)."""

    def upsert(self, kind: str, body: JsonDict) -> Entry:
        self.version += 1
        entry = parse(kind, body)
        old = self.objects[kind].get(entry.key)
        if old is not None and old.body.get("spec") == body.get("spec") and old.model is not None:
            entry.model = old.model  # unchanged spec: keep the parsed model (cheap status-only updates)
        self.objects[kind][entry.key] = entry
        return entry

    def update_status(self, kind: str, key: Key, status: JsonDict) -> None:
        """Fold the operator's own status write in, before the watch event comes back."""
        entry = self.objects[kind].get(key)
        if entry is not None:
            entry.body = {**entry.body, "status": {**entry.status, **status}}

    def remove(self, kind: str, key: Key) -> None:
        self.version += 1
        self.objects[kind].pop(key, None)

    def get(self, kind: str, namespace: str | None, name: str) -> Entry | None:
        return self.objects[kind].get((namespace, name))

    def all(self, kind: str) -> Iterator[Entry]:
        return iter(list(self.objects[kind].values()))

    def links_to(self, namespace: str | None, pd_cluster: str) -> list[Entry]:
        return [
            e
            for e in self.objects[KIND_INTER_DC_LINK].values()
            if e.namespace == namespace and e.valid and e.model.spec.pd_cluster_ref.name == pd_cluster
        ]

    def versions(self, kind: str | None) -> dict[Key, str | None]:
        """Keys and resourceVersions of one kind (``None``: the pods), for :func:`resync_plan`."""
        return {k: resource_version(b) for k, b in self.bodies(kind).items()}

    def bodies(self, kind: str | None) -> dict[Key, JsonDict]:
        """The cached bodies of one kind (``None``: the pods)."""
        if kind is None:
            return dict(self.pods)
        return {k: e.body for k, e in self.objects[kind].items()}

    def upsert_pod(self, body: JsonDict) -> None:
        meta = body.get("metadata") or {}
        key = (meta.get("namespace"), str(meta.get("name")))
        self.remove_pod(*key)
        labels = meta.get("labels") or {}
        if LABEL_PD_CLUSTER in labels or LABEL_PREFILL_CLUSTER in labels:
            self.pods[key] = body
            for label in (LABEL_PD_CLUSTER, LABEL_PREFILL_CLUSTER):
                if label in labels:
                    self._pod_index.setdefault((key[0], label, str(labels[label])), set()).add(key)

    def remove_pod(self, namespace: str | None, name: str) -> None:
        body = self.pods.pop((namespace, name), None)
        if body is None:
            return
        labels = body.get("metadata", {}).get("labels") or {}
        for label in (LABEL_PD_CLUSTER, LABEL_PREFILL_CLUSTER):
            if label in labels:
                self._pod_index.get((namespace, label, str(labels[label])), set()).discard((namespace, name))

    def pods_of(self, namespace: str | None, label: str, value: str) -> list[JsonDict]:
        """Live (not terminating) pods with ``label=value`` in ``namespace``, by name."""
        keys = sorted(self._pod_index.get((namespace, label, value), set()), key=lambda k: k[1])
        pods = (self.pods[k] for k in keys if k in self.pods)
        return [p for p in pods if not p.get("metadata", {}).get("deletionTimestamp")]


def _key(body: JsonDict) -> Key:
    meta = body.get("metadata") or {}
    ns = meta.get("namespace")
    return (str(ns) if ns else None, str(meta.get("name", "")))


def resource_version(body: JsonDict) -> str | None:
    rv = (body.get("metadata") or {}).get("resourceVersion")
    return str(rv) if rv is not None else None


def newer(listed: str | None, cached: str | None) -> bool:
    """Whether the listed copy is newer than the cached one. resourceVersions are opaque strings to clients, but
    every real server (etcd revisions) and the emulator issue increasing integers; compare those as numbers, so a
    watch event that overtook the list is never rolled back, and anything else by inequality."""
    if listed is None or listed == cached:
        return False
    if cached is None:
        return True
    if listed.isdigit() and cached.isdigit():
        return int(listed) > int(cached)
    return True


VOLATILE_METADATA = frozenset({"resourceVersion", "managedFields"})


def status_only(old: JsonDict, new: JsonDict) -> bool:
    """Whether two versions differ only in status (and bookkeeping metadata). kopf's update handlers do not fire
    for such changes, so a cache's statuses lag behind the API's (a standby's most of all); a re-list refreshes
    them without reconciling anything."""

    def core(body: JsonDict) -> JsonDict:
        meta = {k: v for k, v in (body.get("metadata") or {}).items() if k not in VOLATILE_METADATA}
        return {**{k: v for k, v in body.items() if k != "status"}, "metadata": meta}

    return core(old) == core(new)


@dataclass(frozen=True)
class ResyncPlan:
    """What one re-list changes in the cache: bodies to upsert and keys to drop."""

    upserts: tuple[JsonDict, ...] = ()
    removals: tuple[Key, ...] = ()


def resync_plan(before: Mapping[Key, str | None], cached: Mapping[Key, JsonDict], listed: list[JsonDict]) -> ResyncPlan:
    """Compare a list with the cache. ``before`` is the cache's keys and resourceVersions taken *before* the list
    was requested, ``cached`` the cache now: watch events that land while the list is in flight win. An object
    the watch removed meanwhile is not resurrected; one the watch added meanwhile is not dropped."""
    seen: set[Key] = set()
    upserts: list[JsonDict] = []
    for body in listed:
        key = _key(body)
        seen.add(key)
        if key in cached:
            if newer(resource_version(body), resource_version(cached[key])):
                upserts.append(body)
        elif key not in before:  # never seen by the watch: the missed creation
            upserts.append(body)
    removals = [
        key
        for key, body in cached.items()
        if key not in seen and key in before and before[key] == resource_version(body)
    ]
    return ResyncPlan(tuple(upserts), tuple(removals))
