"""The Kubernetes API emulator for the operator's tests: kmock's KubernetesEmulator, with its gaps fixed.

kmock 0.8 keeps objects and serves list/watch/get/patch/delete over real HTTP, but assigns no uid,
creationTimestamp, resourceVersion or generation, lists carry no ``kind``, the URL's namespace is not copied
into created objects, and it never answers 409 by itself. This subclass adds: uid + creationTimestamp on
create; a fresh resourceVersion on every write; ``generation`` bumped only when ``spec`` changes (so
``observedGeneration`` settles); ``kind: XList`` on lists; the URL namespace in ``metadata.namespace``;
the ``scale`` subresource as the API server serves it (:mod:`.k8s_scale`);
optimistic concurrency (a merge patch carrying ``metadata.resourceVersion`` that is stale gets 409, as the
real API server does; a failed JSON-patch ``test`` gets 422); the core group's discovery as kubectl reads it;
fault injection (N answers of a status for requests matching a method and path); and counts of WATCH requests
per resource and of all requests by verb and resource (``requests``; benchmarks read API calls per cycle from it).
Authentication as a test needs it: the bearer token of every request is counted (``bearers``, as the API server
sees it), and with ``accepted_tokens`` set any other token (or none) is answered 401 Unauthorized, as a real API
server answers an expired or rotated-away token.

Scale: kmock matches every request to a reaction by running its whole request log through each reaction's
filters (``request in reaction``, an identity search: O(log) per request, ~50-300 ms with a 2,000-entry log),
finds an object by scanning *all* stored objects on every get/patch/create/delete (O(N) per request), and
keeps every past version of every object and every request each reaction served. This subclass matches
against the requests being served right now only (``__iter__``; the full log stays in ``_requests``,
trimmed), serves get/patch/create/delete by key (O(1)) and lists from a per-resource index, and keeps the
last two versions of an object, so that thousands of objects (the operator's scale benchmark) stay cheap.
Behaviour is otherwise kmock's.

It runs in a background thread with its own event loop; tests talk to it over HTTP like kubectl would.
What it cannot prove: schema defaulting/pruning, server-side apply, RBAC, admission (see operator/README.md).
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import itertools
import re
import threading
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import kmock
from kmock._internal import dicts, enums, parsing

from prfaas_core.api import KINDS
from prfaas_core.names import API_GROUP, API_VERSION

from .k8s_scale import SCALE, serve_scale

CORE = (
    ("v1", "pods", "Pod", True, ("status",)),
    ("v1", "configmaps", "ConfigMap", True, ()),
    ("v1", "secrets", "Secret", True, ()),
    ("v1", "events", "Event", True, ()),
    ("v1", "namespaces", "Namespace", False, ()),
    ("apps/v1", "deployments", "Deployment", True, ("status", "scale")),
    ("apps/v1", "statefulsets", "StatefulSet", True, ("status", "scale")),
    ("coordination.k8s.io/v1", "leases", "Lease", True, ()),
    ("events.k8s.io/v1", "events", "Event", True, ()),
)
VERBS = {"get", "list", "watch", "create", "patch", "update", "delete"}

_parse_path = parsing.parse_path
_NAMESPACES = re.compile(r"^/api/v1/namespaces(?:/([^/]+))?/?$")


def _parse_path_fixed(path: str) -> parsing.ParsedPath:
    """kmock 0.8 cannot parse ``/api/v1/namespaces`` (kopf's namespace observer lists it)."""
    m = _NAMESPACES.match(path)
    if m:
        return parsing.ParsedPath("", "v1", "namespaces", None, m.group(1), None)
    return _parse_path(path)


parsing.parse_path = _parse_path_fixed


@dataclass
class Fault:
    """Answer ``status`` to the next ``count`` requests with this method whose path matches ``path``."""

    method: str
    path: re.Pattern[str]
    status: int
    count: int
    hits: int = 0


def _int_version(value: Any) -> int | None:
    """A resourceVersion as the emulator issues them (increasing integers); None for anything else."""
    return int(value) if isinstance(value, str) and value.isdigit() else None


class K8sEmulator(kmock.KubernetesEmulator):  # type: ignore[misc]
    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._rv = itertools.count(1000)
        self._write_lock = asyncio.Lock()
        self._faults: list[Fault] = []
        self._faults_lock = threading.Lock()
        self.watches: Counter[str] = Counter()
        self.writes: Counter[str] = Counter()
        self.requests: Counter[str] = Counter()  # "PATCH pdclusters/status" -> count (every request served)
        self._index: dict[Any, dict[tuple[Any, str | None, str], None]] = {}  # resource -> keys, in order
        self._serving: dict[int, Any] = {}  # id -> request, while it is being served
        self.write_log: list[tuple[str, str, Any]] = []  # (method, path, body) of every create/update, in order
        self.bearers: Counter[str] = Counter()  # bearer token ("" for none) -> requests that carried it
        self.accepted_tokens: set[str] | None = None  # None: every request is authenticated; else only these
        for gv, plural, kind, namespaced, subs in CORE:
            self.resources[f"{gv}/{plural}"] = kmock.ResourceInfo(
                kind=kind, namespaced=namespaced, verbs=VERBS, subresources=set(subs)
            )
        for k in KINDS:
            self.resources[f"{API_GROUP}/{API_VERSION}/{k.plural}"] = kmock.ResourceInfo(
                kind=k.kind,
                singular=k.singular,
                namespaced=k.namespaced,
                verbs=VERBS,
                subresources={"status", "scale"} if k.scale else {"status"},
                shortnames=set(k.short_names),
            )

    async def _serve_version(self, request: Any) -> Any:
        """kmock 0.8 names the core group's version ``/v1`` in its discovery (kubectl then finds no core kind)."""
        payload = await super()._serve_version(request)
        payload["groupVersion"] = str(payload["groupVersion"]).lstrip("/")
        return payload

    async def _serve_watch(self, request: Any) -> AsyncIterator[Any]:
        """A watch from ``resourceVersion`` (what a client that listed, or that watched before, sends): as the API
        server, nothing the client has already seen. kmock opens every watch with an ADDED event for every stored
        object whatever the version asked for, so each reconnect of a quiet stream (kopf reconnects one after 70 s
        without events) replayed the whole kind through the operator's watch handlers: at 1,000 clusters most of
        an idle operator's CPU, none of which a real cluster costs. ADDED events of objects no newer than the
        version asked for are left out; every other event (and every object changed since) still comes."""
        since = _int_version((request.params or {}).get("resourceVersion"))
        async for event in super()._serve_watch(request):
            if since is not None and isinstance(event, dict) and event.get("type") == "ADDED":
                version = _int_version(((event.get("object") or {}).get("metadata") or {}).get("resourceVersion"))
                if version is not None and version <= since:
                    continue
            yield event

    def __iter__(self) -> Iterator[Any]:
        """The requests being served now: what kmock's reaction matching searches (see the module docstring)."""
        return iter(list(self._serving.values()))

    # --- faults ---------------------------------------------------------------------------------------
    def inject(self, method: str, path: str, status: int, count: int = 1) -> Fault:
        fault = Fault(method.upper(), re.compile(path), status, count)
        with self._faults_lock:
            self._faults.append(fault)
        return fault

    def _fault(self, request: Any) -> Fault | None:
        with self._faults_lock:
            for f in self._faults:
                method = str(getattr(request.method, "value", request.method)).upper()
                if f.count > 0 and method == f.method and f.path.search(request.url.path):
                    f.count -= 1
                    f.hits += 1
                    return f
        return None

    # --- the fixes ------------------------------------------------------------------------------------
    def _next_rv(self) -> str:
        return str(next(self._rv))

    async def _handle(self, request: Any) -> Any:
        self._serving[id(request)] = request
        try:
            return await self._handle_one(request)
        finally:
            self._serving.pop(id(request), None)

    def _authenticate(self, request: Any) -> None:
        auth = next((str(v) for k, v in (request.headers or {}).items() if k.lower() == "authorization"), "")
        token = auth[len("Bearer ") :].strip() if auth.startswith("Bearer ") else ""
        self.bearers[token] += 1
        accepted = self.accepted_tokens
        if accepted is not None and token not in accepted:
            raise kmock.KubernetesError(status=401, reason="Unauthorized", message="Unauthorized")

    async def _handle_one(self, request: Any) -> Any:
        self._authenticate(request)
        fault = self._fault(request)
        if fault is not None:
            reason = {409: "Conflict", 429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}
            raise kmock.KubernetesError(
                status=fault.status, reason=reason.get(fault.status, "Injected"), message=f"injected {fault.status}"
            )
        if len(self._requests) > 2000:  # keep memory flat in long runs
            del self._requests[:1000]
            for reaction in self._payloads:  # each reaction logs what it served, too
                if len(getattr(reaction, "_requests", ())) > 1000:
                    del reaction._requests[:-100]
        if request.resource is None:
            return await super()._handle(request)
        method = str(getattr(request.method, "value", request.method)).upper()
        sub = f"/{request.subresource}" if request.subresource else ""
        action = "WATCH" if request.action == enums.action.WATCH else method
        self.requests[f"{action} {request.resource.plural}{sub}"] += 1
        if request.subresource == "scale" and request.resource.plural in SCALE:
            return await serve_scale(self, request, SCALE[request.resource.plural])
        if request.action == enums.action.WATCH:
            self.watches[request.resource.plural] += 1
            return await super()._handle(request)
        if request.action not in (enums.action.CREATE, enums.action.UPDATE):
            return await super()._handle(request)
        async with self._write_lock:
            self.writes[request.resource.plural] += 1
            self.write_log.append((method, request.url.path, copy.deepcopy(request.data)))
            if request.action == enums.action.CREATE:
                self._prepare_create(request)
                data = request.data if isinstance(request.data, dict) else {}
                meta = data.get("metadata") or {}
                key = (request.resource, request.namespace or meta.get("namespace"), meta.get("name"))
                self._index.setdefault(request.resource, {})[key] = None
            else:
                self._prepare_update(request)
            try:
                return await super()._handle(request)
            finally:
                self._trim(request)

    def _trim(self, request: Any) -> None:
        """Keep the last two versions of a patched object (kmock keeps all: memory grows with every write)."""
        obj = self._objects._objects.get((request.resource, request.namespace, request.name))
        if obj is not None and len(obj.history) > 2:
            del obj.history[:-2]

    # --- O(1) lookups (kmock scans every stored object per request) -----------------------------------
    def _lookup(self, request: Any, namespace: str | None, name: str | None) -> Any:
        obj = self._objects._objects.get((request.resource, namespace, name))
        if obj is None:
            raise kmock.KubernetesObjectNotFoundError()
        return obj

    async def _serve_fetch(self, request: Any) -> Any:
        obj = self._objects._objects.get((request.resource, request.namespace, request.name))
        if obj is None or obj.deleted:
            raise kmock.KubernetesObjectNotFoundError()
        return obj.raw

    async def _serve_create(self, request: Any) -> Any:
        meta = (request.data or {}).get("metadata", {}) if isinstance(request.data, dict) else {}
        return self._lookup(request, request.namespace or meta.get("namespace"), request.name or meta.get("name")).raw

    async def _serve_update(self, request: Any) -> Any:
        return self._lookup(request, request.namespace, request.name).last.raw

    async def _serve_delete(self, request: Any) -> Any:
        return self._lookup(request, request.namespace, request.name).last.raw

    def _prepare_create(self, request: Any) -> None:
        data = request.data
        if not isinstance(data, dict):
            return
        meta = data.setdefault("metadata", {})
        if request.namespace and not meta.get("namespace"):
            meta["namespace"] = request.namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        meta["resourceVersion"] = self._next_rv()
        meta["generation"] = 1
        meta.pop("deletionTimestamp", None)

    def _prepare_update(self, request: Any) -> None:
        key = (request.resource, request.namespace, request.name)
        if key not in self._objects or self._objects[key].deleted:
            return  # kmock answers 404
        current = copy.deepcopy(dict(self._objects[key].raw))
        cur_meta = current.get("metadata") or {}
        data = request.data
        if isinstance(data, list):  # JSON patch (kopf's finalizers, with a "test" on resourceVersion)
            try:
                after = jsonpatch.apply_patch(current, data, in_place=False)
            except (jsonpatch.JsonPatchTestFailed, jsonpatch.JsonPatchConflict) as exc:
                raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from None
            ops = [{"op": "add", "path": "/metadata/resourceVersion", "value": self._next_rv()}]
            if after.get("spec") != current.get("spec"):
                ops.append(
                    {"op": "add", "path": "/metadata/generation", "value": int(cur_meta.get("generation", 1)) + 1}
                )
            request.data[:] = [*data, *ops]
            return
        if not isinstance(data, dict):
            return
        meta = data.get("metadata")
        if not isinstance(meta, dict):
            meta = {}
        wanted = meta.get("resourceVersion")
        if wanted is not None and str(wanted) != str(cur_meta.get("resourceVersion")):
            raise kmock.KubernetesError(
                status=409,
                reason="Conflict",
                message=f"the object has been modified (resourceVersion {wanted} is stale)",
            )
        after = dicts.patch_dict(copy.deepcopy(current), data)
        meta["resourceVersion"] = self._next_rv()
        for immutable in ("uid", "creationTimestamp", "namespace", "name"):
            if immutable in cur_meta:
                meta[immutable] = cur_meta[immutable]
        if request.subresource not in ("status",) and after.get("spec") != current.get("spec"):
            meta["generation"] = int(cur_meta.get("generation", 1)) + 1
        else:
            meta["generation"] = cur_meta.get("generation", 1)
        data["metadata"] = meta

    async def _serve_list(self, request: Any) -> Any:
        objects = self._objects._objects
        items = []
        for key in self._index.get(request.resource, {}):
            _, namespace, name = key
            if request.namespace is not None and namespace != request.namespace:
                continue
            if request.name is not None and name != request.name:
                continue
            obj = objects.get(key)
            if obj is not None and not obj.deleted:
                items.append(obj.raw)
        kind = None
        known = False
        for res in self.resources:
            if res == request.resource:
                known = True
                info = self.resources[res]
                kind = info.kind if info is not None else None
        if not known and not items and request.resource not in self._get_resources():
            raise kmock.KubernetesResourceNotFoundError()
        payload: dict[str, Any] = {"items": items}
        payload["kind"] = f"{kind or request.resource.plural.capitalize()}List"
        group, version = request.resource.group, request.resource.version
        payload["apiVersion"] = f"{group}/{version}" if group else version
        payload["metadata"] = {"resourceVersion": str(next(self._rv))}
        return payload


class EmulatorThread:
    """The emulator on 127.0.0.1, served from a background thread; ``url`` and a kubeconfig for clients."""

    def __init__(self) -> None:
        self.emulator: K8sEmulator | None = None
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.port = 0
        self._thread = threading.Thread(target=self._run, name="k8s-emulator", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        self.emulator = K8sEmulator()
        async with self.emulator, kmock.Server(self.emulator) as server:
            self.port = server.port
            self._ready.set()
            await self._stop.wait()

    def start(self) -> EmulatorThread:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the emulator did not start")
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        # the server's shutdown closes every open watch stream: on a loaded machine that takes more than a few
        # seconds, and a loop left unclosed leaks its self-pipe (a ResourceWarning in whichever test runs next)
        self._thread.join(60)
        if not self._thread.is_alive():
            self.loop.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def k8s(self) -> K8sEmulator:
        assert self.emulator is not None
        return self.emulator

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        path.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: emu\n"
            f"clusters:\n- name: emu\n  cluster:\n    server: {self.url}\n"
            f"contexts:\n- name: emu\n  context:\n    cluster: emu\n    user: emu\n    namespace: {namespace}\n"
            "users:\n- name: emu\n  user:\n    token: emulator-token\n"
        )
        return path
