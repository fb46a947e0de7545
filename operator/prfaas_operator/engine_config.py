"""The ``EngineConfig`` condition of a PD cluster: do the running engine pods carry the args and env the resources
imply? (An engine started without its KV connector serves, and quietly recomputes every remote prefill.)

Rendered through the core's :func:`~prfaas_core.launch.render.cluster_launches` (the one engine-flag function) and
compared with each pod's engine container (the container with the port named ``http``) as the API server holds
it. Pods that run no vLLM (the emulators of the tests and the demo) are not judged: Unknown.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prfaas_core.api import InterDCLink, ModelProfile, PDCluster, PrefillCluster
from prfaas_core.launch.engines import EngineRole
from prfaas_core.launch.kinds import engine_kind
from prfaas_core.launch.render import RenderError, cluster_launches, launch_diff
from prfaas_core.schema.engine_checks import cluster_engine_issues, link_issues

from . import pods as podlib
from .kube import JsonDict

CONDITION = "EngineConfig"
MAX_LISTED = 5
"""Pods named in the message at most (the rest are counted)."""

VLLM = engine_kind("vllm")
"""The engine kind whose pods the check judges (the one the launch code renders)."""


@dataclass(frozen=True)
class EngineConfigVerdict:
    status: str
    """True (every vLLM pod matches), False (a pod differs, or the resources cannot render), Unknown."""
    reason: str
    message: str


def engine_container(pod: JsonDict) -> JsonDict | None:
    """The pod's engine container: the one whose port is named ``http`` (how the operator addresses engines)."""
    for c in (pod.get("spec") or {}).get("containers") or []:
        if any(p.get("name") == "http" for p in c.get("ports") or []):
            return dict(c)
    return None


def runs_vllm(container: JsonDict) -> bool:
    return VLLM.runs_in(container)


def _pod_role(cluster: PDCluster, pod: JsonDict) -> EngineRole | None:
    if cluster.spec.role_assignment.mode == "Relabel":
        return "pd-both"
    role = podlib.role(pod)
    return "pd-prefill" if role == "prefill" else "pd-decode" if role == "decode" else None


def engine_config(
    cluster: PDCluster,
    profile: ModelProfile,
    pods: Sequence[JsonDict],
    links: Iterable[InterDCLink] = (),
    prefill_clusters: dict[str, PrefillCluster] | None = None,
) -> EngineConfigVerdict:
    """The condition for ``cluster`` given its live pods."""
    try:
        launches = cluster_launches(cluster, profile)
    except RenderError as exc:
        return EngineConfigVerdict("False", "InvalidEngineConfig", f"{exc.field}: {exc.reason}")
    errors, _ = cluster_engine_issues(cluster, profile)
    profiles = {profile.metadata.name: profile}
    for link in links:
        prefill = (prefill_clusters or {}).get(link.spec.prefill_cluster_ref.name)
        if prefill is not None:
            errors += link_issues(link, prefill, cluster, profiles)[0]
    if errors:
        return EngineConfigVerdict("False", "InvalidEngineConfig", "; ".join(f"{e.path}: {e.message}" for e in errors))
    judged, differing = 0, []
    for pod in pods:
        container = engine_container(pod)
        role = _pod_role(cluster, pod)
        if container is None or not runs_vllm(container) or role is None:
            continue
        judged += 1
        diffs = launch_diff(launches[role], container)
        if diffs:
            differing.append(f"pod {podlib.name(pod)} ({role}): " + "; ".join(str(d) for d in diffs))
    if differing:
        more = f" (and {len(differing) - MAX_LISTED} more pods)" if len(differing) > MAX_LISTED else ""
        return EngineConfigVerdict("False", "EngineFlagsDiffer", " | ".join(differing[:MAX_LISTED]) + more)
    if not judged:
        return EngineConfigVerdict("Unknown", "NoVllmEngines", "no pod of the cluster runs vLLM; nothing to compare")
    return EngineConfigVerdict("True", "Matches", f"{judged} vLLM pods run the args and env the resources imply")
