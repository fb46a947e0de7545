"""Checks of the engine configuration the resources imply, before anything is deployed (``prfaas validate``; the
operator's ``EngineConfig`` condition uses :func:`cluster_engine_issues`). Pure.

Errors (the engines would fail or silently recompute): a cluster that cannot render (kv_role against the
role-assignment mode, a side-channel port on the HTTP port); the two ends of an InterDCLink
with different connectors, a non-TCP transport across the (Ethernet) link, or different models (served name or
KV geometry), a Mamba2 hybrid with prefix caching turned on, a hybrid with block sizes that differ across a link.
Warnings: a hybrid (linear-attention) model with a connector whose hybrid-KV support in the pinned vLLM is limited
and that the real-engine tier has not proven (it runs a gated-DeltaNet and a Mamba2 hybrid over NixlConnector),
and a dense model's block sizes that differ across a link.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..api.base import ApiModel
from ..api.inter_dc_link import InterDCLink
from ..api.model_profile import ModelProfile
from ..api.pd_cluster import PDCluster
from ..api.prefill_cluster import PrefillCluster
from ..capacity.kv import KvModelError, kv_model_from_profile
from ..launch.render import Cluster, RenderError, engine_specs
from .check import Issue

PINNED_VLLM = "0.32.0"
"""The vLLM version the engine flags are written for (scripts/real-engines.sh pins the same)."""

HYBRID_LIMITS: Mapping[str, str] = {
    "NixlConnector": (
        f"vLLM {PINNED_VLLM}'s NixlConnector moves hybrid KV only through the hybrid KV-cache manager: a Mamba/"
        "linear-attention model fails with prefix caching when the two ends' physical blocks per KV block differ, "
        "and pipeline parallelism is not supported with Mamba/SSM layouts"
    ),
    "MooncakeConnector": (
        f"vLLM {PINNED_VLLM}'s MooncakeConnector carries linear-attention state on its MambaSpec path, tested "
        "upstream with GDN only (Mamba2 and other recurrent layers are not validated)"
    ),
}

PROVEN_HYBRIDS: Mapping[str, frozenset[str]] = {"NixlConnector": frozenset({"GatedDeltaNet", "Mamba2"})}
"""Connector and linear kind pairs the real-engine tier runs P/D with on the pinned vLLM
(``tests/real/test_real_hybrid.py``): no warning for them."""

FIXED_STATE_SHARE = 0.05
"""A measured profile whose fixed per-request state is above this share of its shortest point's KV is taken as a
hybrid (linear-attention) model: pure attention KV grows from ~0."""


def is_hybrid(profile: ModelProfile) -> bool:
    """Whether the model keeps a per-request recurrent state beside its attention KV (linear attention)."""
    arch = profile.spec.architecture
    if arch is not None:
        return arch.linear_layers > 0
    if profile.spec.measured is None:
        return False
    try:
        model = kv_model_from_profile(profile.spec)
    except KvModelError:
        return False
    shortest = min(profile.spec.measured.points, key=lambda p: p.length_tokens)
    return model.fixed_bytes > FIXED_STATE_SHARE * model.kv_bytes(shortest.length_tokens)


def cluster_engine_issues(cluster: Cluster, profile: ModelProfile | None) -> tuple[list[Issue], list[Issue]]:
    """One cluster on its own: (errors, warnings)."""
    errors: list[Issue] = []
    warnings: list[Issue] = []
    if profile is None:
        return errors, warnings  # a dangling reference: reported as such
    try:
        engine_specs(cluster, profile)
    except RenderError as exc:
        errors.append(Issue(exc.field, exc.reason, "engine"))
    connector = cluster.spec.kv_transport.connector
    arch = profile.spec.architecture
    kind = arch.linear_kind if arch is not None else None
    if kind == "Mamba2" and "--enable-prefix-caching" in cluster.spec.engine.extra_args:
        errors.append(
            Issue(
                "spec.engine.extraArgs",
                f"ModelProfile {profile.metadata.name} is a Mamba2 hybrid: vLLM {PINNED_VLLM} fails on its first "
                "prefill with prefix caching on (the engines run with --no-enable-prefix-caching)",
                "engine",
            )
        )
    proven = kind is not None and kind in PROVEN_HYBRIDS.get(connector, frozenset())
    if is_hybrid(profile) and connector in HYBRID_LIMITS and not proven:
        warnings.append(
            Issue(
                "spec.kvTransport.connector",
                f"ModelProfile {profile.metadata.name} is a hybrid (linear-attention) model: "
                f"{HYBRID_LIMITS[connector]}",
                "engine",
            )
        )
    return errors, warnings


def _geometry(profile: ModelProfile) -> tuple[float, float] | None:
    try:
        model = kv_model_from_profile(profile.spec)
    except KvModelError:
        return None
    return round(model.bytes_per_token, 3), round(model.fixed_bytes, 0)


def link_issues(
    link: InterDCLink, prefill: PrefillCluster, pd: PDCluster, profiles: Mapping[str, ModelProfile]
) -> tuple[list[Issue], list[Issue]]:
    """The two ends of ``link``: (errors, warnings), all reported on the PDCluster (the receiving end)."""
    errors: list[Issue] = []
    warnings: list[Issue] = []
    via = f"PrefillCluster {prefill.metadata.name}, which sends KV here over InterDCLink {link.metadata.name}"
    a, b = prefill.spec.kv_transport, pd.spec.kv_transport
    if a.connector != b.connector:
        errors.append(
            Issue(
                "spec.kvTransport.connector",
                f"{b.connector} differs from {a.connector} of {via}: both ends of a link must run the same KV "
                "connector (a decode engine cannot pull KV another connector produced)",
                "engine",
            )
        )
    for who, transport, path in (("this PDCluster", b, "spec.kvTransport.protocol"), (via, a, None)):
        if transport.protocol != "tcp":
            where = path or f"PrefillCluster {prefill.metadata.name} spec.kvTransport.protocol"
            errors.append(
                Issue(
                    "spec.kvTransport.protocol",
                    f"{where} is {transport.protocol}: KV across datacenters crosses an Ethernet (VPC) link, which "
                    f"carries no RDMA; use tcp ({who})",
                    "engine",
                )
            )
    pa, pb = profiles.get(prefill.spec.model_profile_ref.name), profiles.get(pd.spec.model_profile_ref.name)
    if pa is not None and pb is not None and pa.metadata.name != pb.metadata.name:
        if pa.spec.served_model_name != pb.spec.served_model_name:
            errors.append(
                Issue(
                    "spec.modelProfileRef.name",
                    f"serves {pb.spec.served_model_name!r} (ModelProfile {pb.metadata.name}) but {via} serves "
                    f"{pa.spec.served_model_name!r} (ModelProfile {pa.metadata.name}): both ends must serve the same "
                    "model",
                    "engine",
                )
            )
        elif _geometry(pa) != _geometry(pb):
            errors.append(
                Issue(
                    "spec.modelProfileRef.name",
                    f"ModelProfile {pb.metadata.name} gives another KV geometry (bytes per token, fixed state "
                    f"{_geometry(pb)}) than {pa.metadata.name} of {via} ({_geometry(pa)}): the KV one end produces "
                    "would not fit the other's cache",
                    "engine",
                )
            )
    if prefill.spec.engine.block_size != pd.spec.engine.block_size:
        hybrid = any(p is not None and is_hybrid(p) for p in (pa, pb))
        (errors if hybrid else warnings).append(
            Issue(
                "spec.engine.blockSize",
                f"{pd.spec.engine.block_size} differs from {prefill.spec.engine.block_size} of {via}: vLLM "
                f"{PINNED_VLLM} pulls across block sizes only for full-attention layouts"
                + (" (this hybrid model's pulls would fail)" if hybrid else "")
                + ", and the routers' prefixBlockTokens cannot match both",
                "engine",
            )
        )
    return errors, warnings


def engine_issues(
    models: Sequence[ApiModel | None], default_namespace: str = "default"
) -> tuple[dict[int, list[Issue]], dict[int, list[Issue]]]:
    """Errors and warnings by position in ``models`` (None: an object that did not validate)."""
    errors: dict[int, list[Issue]] = {}
    warnings: dict[int, list[Issue]] = {}
    profiles = {m.metadata.name: m for m in models if isinstance(m, ModelProfile)}

    def ns(m: PrefillCluster | PDCluster | InterDCLink) -> str:
        return m.metadata.namespace or default_namespace

    pd_at: dict[tuple[str, str], int] = {}
    prefill_at: dict[tuple[str, str], list[int]] = {}
    """Region A's Managed object and region B's Remote description of the same cluster share a name: both are
    checked against the link."""
    for i, m in enumerate(models):
        if isinstance(m, PrefillCluster | PDCluster):
            errs, warns = cluster_engine_issues(m, profiles.get(m.spec.model_profile_ref.name))
            errors.setdefault(i, []).extend(errs)
            warnings.setdefault(i, []).extend(warns)
            if isinstance(m, PDCluster):
                pd_at.setdefault((ns(m), m.metadata.name), i)
            else:
                prefill_at.setdefault((ns(m), m.metadata.name), []).append(i)
    for m in models:
        if not isinstance(m, InterDCLink):
            continue
        di = pd_at.get((ns(m), m.spec.pd_cluster_ref.name))
        if di is None:
            continue  # a dangling reference: reported as such
        pd = models[di]
        assert isinstance(pd, PDCluster)
        for pi in prefill_at.get((ns(m), m.spec.prefill_cluster_ref.name), []):
            prefill = models[pi]
            assert isinstance(prefill, PrefillCluster)
            errs, warns = link_issues(m, prefill, pd, profiles)
            errors.setdefault(di, []).extend(e for e in errs if e not in errors.get(di, []))
            warnings.setdefault(di, []).extend(w for w in warns if w not in warnings.get(di, []))
    return {k: v for k, v in errors.items() if v}, {k: v for k, v in warnings.items() if v}
