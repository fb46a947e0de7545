"""The ``scale`` subresource for the Kubernetes API emulator, as the real API server serves it.

kmock 0.8 knows subresources only as names: a GET of ``.../scale`` answered the whole object and a PATCH
merged its body into the object. The real API server answers an ``autoscaling/v1`` ``Scale`` (``spec.replicas``
from the kind's spec replicas path, ``status.replicas`` and ``status.selector`` from its status) and a write to
``spec.replicas`` sets that path on the object (a new resourceVersion and generation; watchers see a MODIFIED
event). Deployments and StatefulSets map ``.spec.replicas``/``.status.replicas`` and their label selector;
custom resources map what their CRD's ``subresources.scale`` declares, and a write is checked against the CRD's
schema and CEL rules (the checks ``prfaas validate`` runs), refused with 422 naming the field, as the API server
refuses a /scale write the object's validation rejects.

Not proven here: a real API server's /scale for these CRDs (field managers, ``Scale`` on the wire through
the aggregated autoscaling group, an HPA's own selector handling); see docs/operator.md.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import dicts, enums

from prfaas_core.api import KINDS
from prfaas_core.schema.check import check_against_crd
from prfaas_core.schema.crds import crd_schema_by_kind


@dataclass(frozen=True)
class ScalePaths:
    spec_replicas: tuple[str, ...]
    status_replicas: tuple[str, ...]
    selector: tuple[str, ...] | None
    """Where the label selector string is (custom resources); ``None``: from ``spec.selector.matchLabels``."""
    kind: str | None = None
    """The custom resource kind whose CRD checks a write (``None``: a built-in workload)."""


SCALE: dict[str, ScalePaths] = {
    "deployments": ScalePaths(("spec", "replicas"), ("status", "replicas"), None),
    "statefulsets": ScalePaths(("spec", "replicas"), ("status", "replicas"), None),
}
for _k in KINDS:
    if _k.scale:
        SCALE[_k.plural] = ScalePaths(("spec", "instances"), ("status", "replicas"), ("status", "selector"), _k.kind)


def _dig(obj: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def _nested(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {path[-1]: value}
    for part in reversed(path[:-1]):
        out = {part: out}
    return out


def scale_of(raw: dict[str, Any], paths: ScalePaths) -> dict[str, Any]:
    """The ``autoscaling/v1`` Scale of an object."""
    meta = raw.get("metadata") or {}
    if paths.selector is not None:
        selector = _dig(raw, paths.selector)
    else:
        labels = _dig(raw, ("spec", "selector", "matchLabels")) or {}
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or None
    status: dict[str, Any] = {"replicas": int(_dig(raw, paths.status_replicas) or 0)}
    if selector:
        status["selector"] = selector
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in meta
        },
        "spec": {"replicas": int(_dig(raw, paths.spec_replicas) or 0)},
        "status": status,
    }


def scale_write(raw: dict[str, Any], data: Any, paths: ScalePaths) -> dict[str, Any]:
    """The patch a Scale write makes to the object (422 for a malformed Scale or an object it makes invalid)."""
    replicas = (data.get("spec") or {}).get("replicas") if isinstance(data, dict) else None
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        raise kmock.KubernetesError(
            status=422, reason="Invalid", message=f"spec.replicas: Invalid value: {replicas!r}: must be >= 0"
        )
    patch = _nested(paths.spec_replicas, replicas)
    rv = (data.get("metadata") or {}).get("resourceVersion")
    if rv is not None:
        patch["metadata"] = {"resourceVersion": rv}
    if paths.kind is not None:
        after = dict(dicts.patch_dict(copy.deepcopy(raw), patch))
        after.pop("status", None)
        for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
            (after.get("metadata") or {}).pop(key, None)
        issues = check_against_crd(crd_schema_by_kind()[paths.kind], after)
        if issues:
            message = "; ".join(f"{i.path}: {i.message}" for i in issues)
            raise kmock.KubernetesError(status=422, reason="Invalid", message=f"{paths.kind} is invalid: {message}")
    return patch


async def serve_scale(emulator: Any, request: Any, paths: ScalePaths) -> aiohttp.web.StreamResponse:
    """GET, PATCH or PUT of ``.../scale``: the write goes through the emulator's own update path."""
    key = (request.resource, request.namespace, request.name)
    obj = emulator._objects._objects.get(key)
    if obj is None or obj.deleted:
        raise kmock.KubernetesObjectNotFoundError()
    method = str(getattr(request.method, "value", request.method)).upper()
    if method in ("PATCH", "PUT"):  # a PUT carries a whole Scale: only spec.replicas (and the RV) matter
        patch = scale_write(dict(obj.raw), request.data, paths)
        inner = attrs.evolve(request, data=patch, subresource=None, method="PATCH", action=enums.action.UPDATE)
        await emulator._handle(inner)
        obj = emulator._objects._objects.get(key)
    elif request.action != enums.action.FETCH:
        raise kmock.KubernetesError(status=405, reason="MethodNotAllowed", message="scale: get, patch or update")
    return aiohttp.web.json_response(scale_of(dict(obj.raw), paths))
