"""What a PDCluster refers to: its ModelProfile, the InterDCLinks that name it and their PrefillClusters —
resolved from the cache, with the reason when something is missing or invalid — and the plan inputs the
core derives from them."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prfaas_core.api import InterDCLink, ModelProfile, PDCluster, PrefillCluster
from prfaas_core.names import KIND_INTER_DC_LINK, KIND_MODEL_PROFILE, KIND_PREFILL_CLUSTER

from .fleet import preference
from .registry import Entry, Key, World


@dataclass(frozen=True)
class Refs:
    profile: ModelProfile
    links: list[InterDCLink]
    prefill_clusters: dict[str, PrefillCluster]
    prefill_entries: dict[str, Entry]
    link_entries: list[Entry]


class LinkIndex:
    """The links by the PD cluster they name and by the PrefillCluster they name, for one cycle
    (``World.links_to`` scans every link: a cycle over N clusters, or N PrefillClusters, would be O(N^2)).
    :meth:`links_to` and :meth:`links_of_site` re-read each indexed link from the world, so a link changed since
    is seen as it is now; one added since waits for the next cycle (its watch event nudges the cluster there
    anyway). Outside a cycle (:meth:`drop`) they ask the world."""

    def __init__(self, world: World) -> None:
        self.world = world
        self._index: dict[Key, list[Key]] | None = None
        self._sites: dict[Key, list[Key]] = {}

    def build(self) -> None:
        index: dict[Key, list[Key]] = {}
        sites: dict[Key, list[Key]] = {}
        for link in self.world.all(KIND_INTER_DC_LINK):
            if link.valid:
                index.setdefault((link.namespace, link.model.spec.pd_cluster_ref.name), []).append(link.key)
                sites.setdefault((link.namespace, link.model.spec.prefill_cluster_ref.name), []).append(link.key)
        self._index, self._sites = index, sites

    def drop(self) -> None:
        self._index, self._sites = None, {}

    def links_to(self, namespace: str | None, pd_cluster: str) -> list[Entry]:
        if self._index is None:
            return self.world.links_to(namespace, pd_cluster)
        keys = self._index.get((namespace, pd_cluster), ())
        return self._read(keys, lambda m: m.spec.pd_cluster_ref.name, pd_cluster)

    def links_of_site(self, namespace: str | None, prefill_cluster: str) -> list[Entry]:
        """The valid links in ``namespace`` that name PrefillCluster ``prefill_cluster``."""
        if self._index is None:
            return [
                e
                for e in self.world.all(KIND_INTER_DC_LINK)
                if e.valid and e.namespace == namespace and e.model.spec.prefill_cluster_ref.name == prefill_cluster
            ]
        keys = self._sites.get((namespace, prefill_cluster), ())
        return self._read(keys, lambda m: m.spec.prefill_cluster_ref.name, prefill_cluster)

    def _read(self, keys: Iterable[Key], ref: Callable[[InterDCLink], str], name: str) -> list[Entry]:
        out = []
        for key in keys:
            link = self.world.get(KIND_INTER_DC_LINK, *key)
            if link is not None and link.valid and ref(link.model) == name:
                out.append(link)
        return out


def resolve(world: World, links: LinkIndex, entry: Entry) -> tuple[Refs | None, str, str]:
    """The references, or (None, reason, message) naming the first that is missing or invalid."""
    pd: PDCluster = entry.model
    ns = entry.namespace
    profile = world.get(KIND_MODEL_PROFILE, None, pd.spec.model_profile_ref.name)
    if profile is None:
        return (
            None,
            "DanglingReference",
            f"spec.modelProfileRef: ModelProfile {pd.spec.model_profile_ref.name!r} not found",
        )
    if not profile.valid:
        return None, "InvalidReference", f"spec.modelProfileRef: ModelProfile {profile.name!r} is invalid"
    link_entries = links.links_to(ns, entry.name)
    ordered = sorted(link_entries, key=lambda e: e.name)
    if not ordered:
        return None, "NoInterDCLink", f"no InterDCLink in namespace {ns} names pdClusterRef {entry.name!r}"
    prefills: dict[str, PrefillCluster] = {}
    prefill_entries: dict[str, Entry] = {}
    for link in ordered:
        ref = link.model.spec.prefill_cluster_ref.name
        pfc = world.get(KIND_PREFILL_CLUSTER, ns, ref)
        if pfc is None:
            return None, "DanglingReference", f"InterDCLink {link.name}: PrefillCluster {ref!r} not found"
        if not pfc.valid:
            return None, "InvalidReference", f"InterDCLink {link.name}: PrefillCluster {ref!r} is invalid"
        prefills[ref] = pfc.model
        prefill_entries[ref] = pfc
    # the links in the routers' preference order (fleet.preference): links[0] is the one the loop plans with
    ordered = sorted(ordered, key=lambda e: preference(e.model, prefills.get(e.model.spec.prefill_cluster_ref.name)))
    return Refs(profile.model, [e.model for e in ordered], prefills, prefill_entries, ordered), "", ""
