"""The routers' configuration: one ConfigMap per PDCluster holding the core's RouterConfig as JSON, and one per
Managed PrefillCluster for its prefill gateway (the same RouterConfig, ``mode: gateway``).

The operator is their one writer. Routers and gateways mount them (kubelet refreshes the file) and hot-reload
them; they never call the Kubernetes API on the hot path. Secrets named by a remote PrefillCluster are expected
mounted at ``/var/run/prfaas/secrets/<secret>/<key>`` in the router pods, and the gateway's own token and TLS
Secrets at ``/var/run/prfaas/gateway/{token,tls}/`` in the gateway pods (the Helm chart does both).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Literal

from prfaas_core.api import (
    GatewayAdmission,
    InterDCLink,
    ModelProfileSpec,
    PDCluster,
    PrefillCluster,
    RemoteGateway,
    RouterConfig,
    RouterEndpoint,
    RouterLink,
)
from prfaas_core.api.engine import EngineSettingsSpec
from prfaas_core.api.router_config import GatewayServing, RoutingParams
from prfaas_core.launch.vllm import KV_EVENTS_PORT_NAME
from prfaas_core.names import (
    ANNOTATION_ROUTER_CONFIG_HASH,
    GROUP_VERSION,
    KIND_PD_CLUSTER,
    KIND_PREFILL_CLUSTER,
    LABEL_COMPONENT,
    LABEL_DRAINING,
    LABEL_MANAGED_BY,
    LABEL_PD_CLUSTER,
    LABEL_PREFILL_CLUSTER,
    LABEL_ROLE,
    MANAGED_BY_VALUE,
)
from prfaas_core.policy.threshold import ThresholdBounds

from . import fleet
from .kube import ApiError, JsonDict, KubeApi, api_path
from .pacing import paced_gbps

SECRETS_DIR = "/var/run/prfaas/secrets"
GATEWAY_DIR = "/var/run/prfaas/gateway"
"""Where the chart mounts the gateway's token Secret (``token/``) and TLS Secret (``tls/``)."""
CONFIG_KEY = "router-config.json"
DEFAULT_ENGINE_PORT = 8000


def configmap_name(pd_name: str) -> str:
    return ROUTER.name(pd_name)


def gateway_configmap_name(prefill_cluster: str) -> str:
    return GATEWAY.name(prefill_cluster)


def pod_url(pod: JsonDict) -> str | None:
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    port = DEFAULT_ENGINE_PORT
    ports = [p for c in (pod.get("spec") or {}).get("containers") or [] for p in c.get("ports") or []]
    named = [p for p in ports if p.get("name") == "http"]
    if named or ports:
        port = int((named or ports)[0].get("containerPort", DEFAULT_ENGINE_PORT))
    return f"http://{ip}:{port}"


def pod_kv_events_url(pod: JsonDict) -> str | None:
    """Where the pod's engine publishes its KV events (its container port named ``kv-events``, which the chart
    renders from ``spec.engine.kvEventsPort``), or None."""
    ip = (pod.get("status") or {}).get("podIP")
    ports = [p for c in (pod.get("spec") or {}).get("containers") or [] for p in c.get("ports") or []]
    port = next((p.get("containerPort") for p in ports if p.get("name") == KV_EVENTS_PORT_NAME), None)
    return f"tcp://{ip}:{int(port)}" if ip and port else None


def pod_endpoints(
    pods: list[JsonDict], role: Literal["prefill", "decode", "both"] | None = None
) -> tuple[list[RouterEndpoint], list[str]]:
    """The engine endpoints (pods with an IP) and the draining names, for a router or a gateway. ``role`` fixes
    every endpoint's role (a gateway fronts prefill instances only); else each pod's ``prfaas.io/role`` label."""
    endpoints, draining = [], []
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        name = str(pod["metadata"]["name"])
        if labels.get(LABEL_DRAINING) == "true":
            draining.append(name)
        url = pod_url(pod)
        label = labels.get(LABEL_ROLE)
        pod_role = role or (label if label in ("prefill", "decode") else "both")
        if url is not None:
            events = pod_kv_events_url(pod)
            endpoints.append(RouterEndpoint(name=name, url=url, role=pod_role, kv_events_url=events))
    return endpoints, draining


def routing_for(engine: EngineSettingsSpec) -> RoutingParams:
    """The routers' short-term settings from the cluster's engines: ``prefixBlockTokens`` is their KV block size
    (``spec.engine.blockSize``), so prefix hashing and the KV counters go by the blocks the engines hold and move;
    the default (16, vLLM's on GPUs) when the engine keeps its own default."""
    return RoutingParams() if engine.block_size is None else RoutingParams(prefix_block_tokens=engine.block_size)


def build_gateway(pfc: PrefillCluster, pods: list[JsonDict], model: ModelProfileSpec) -> RouterConfig:
    """A Managed PrefillCluster's gateway: its prefill pods behind one endpoint, with the token and TLS files
    where the chart mounts the Secrets its ``spec.endpoint`` names, and ``spec.linkScheduling`` as its admission
    and link. No threshold (the gateway routes every leg it is sent); ``pdCluster`` carries the PrefillCluster's
    name, as the chart's rendering did."""
    endpoints, draining = pod_endpoints(pods, role="prefill")
    if pfc.spec.drained:  # a drained site: its gateway starts nothing new, what it holds finishes
        draining = sorted({*draining, *(e.name for e in endpoints)})
    ep = pfc.spec.endpoint
    token, tls = (ep.token_secret_ref, ep.tls_secret_ref) if ep is not None else (None, None)
    ls = pfc.spec.link_scheduling
    admission, links = None, []
    if ls is not None:
        admission = GatewayAdmission.model_validate(
            ls.model_dump(by_alias=True, exclude={"capacity_gbps", "max_utilization", "egress_pacing", "links"})
        )
        if (paced := paced_gbps(pfc)) is not None:  # one pull achieves the pods' paced egress, one pod's pulls share it
            admission = admission.model_copy(update={"pull_gbps": paced, "instance_gbps": paced})
        links = [
            RouterLink(name=sl.name, capacity_gbps=sl.capacity_gbps, max_utilization=sl.max_utilization)
            for sl in ls.all_links()
        ]
    serving = GatewayServing(
        prefill_cluster=pfc.metadata.name,
        token_file=f"{GATEWAY_DIR}/token/{token.key}" if token else None,
        tls_cert_file=f"{GATEWAY_DIR}/tls/tls.crt" if tls else None,
        tls_key_file=f"{GATEWAY_DIR}/tls/tls.key" if tls else None,
        admission=admission,
        site_egress_cap_gbps=pfc.spec.site_egress_cap_gbps if admission is not None else None,
    )
    return RouterConfig(
        pd_cluster=pfc.metadata.name,
        mode="gateway",
        links=links,
        endpoints=endpoints,
        draining=draining,
        threshold_min_tokens=0,
        model=model,
        tokenizer_file=model.tokenizer.file if model.tokenizer else None,
        chat_template_file=model.tokenizer.chat_template_file if model.tokenizer else None,
        prfaas_hardware=pfc.spec.hardware,
        gateway=serving,
        routing=routing_for(pfc.spec.engine),
    )


def build(
    pd: PDCluster,
    pods: list[JsonDict],
    model: ModelProfileSpec,
    links: list[InterDCLink],
    prefill_clusters: dict[str, PrefillCluster],
    bounds: ThresholdBounds,
) -> RouterConfig:
    """A PD cluster's routers' configuration: its endpoints and drain list, the remote gateways and links,
    and the bounds on ``t`` the loop published (:func:`prfaas_core.policy.threshold.published_bounds`). One remote
    per link in service, in :mod:`.fleet`'s preference order; a drained link keeps its place among the links only."""
    endpoints, draining = pod_endpoints(pods)
    remotes = []
    links = fleet.ordered(links, prefill_clusters)
    for link in links:
        pfc = prefill_clusters.get(link.spec.prefill_cluster_ref.name)
        if pfc is None or pfc.spec.mode != "Remote" or pfc.spec.endpoint is None:
            continue
        if fleet.link_drained(link, pfc):
            continue
        ep = pfc.spec.endpoint
        remotes.append(
            RemoteGateway(
                name=pfc.metadata.name,
                url=ep.url,
                status_url=ep.url.rstrip("/") + ep.status_path,
                token_file=f"{SECRETS_DIR}/{ep.token_secret_ref.name}/{ep.token_secret_ref.key}"
                if ep.token_secret_ref
                else None,
                ca_file=f"{SECRETS_DIR}/{ep.tls_secret_ref.name}/ca.crt" if ep.tls_secret_ref else None,
                link=link.metadata.name,
            )
        )
    router_links = [
        RouterLink(
            name=link.metadata.name,
            capacity_gbps=link.spec.capacity_gbps,
            max_utilization=link.spec.max_utilization,
            scarce_watermark=link.spec.scarce_watermark,
            abundant_watermark=link.spec.abundant_watermark,
            metrics_url=link.spec.measurement.metrics_url,
            available_bandwidth=link.spec.measurement.available_bandwidth,
        )
        for link in links
    ]
    return RouterConfig(
        pd_cluster=pd.metadata.name,
        endpoints=endpoints,
        draining=draining,
        remotes=remotes,
        links=router_links,
        threshold_min_tokens=bounds.min_tokens,
        threshold_max_tokens=bounds.max_tokens,
        model=model,
        tokenizer_file=model.tokenizer.file if model.tokenizer else None,
        chat_template_file=model.tokenizer.chat_template_file if model.tokenizer else None,
        slo=pd.spec.slo,
        routing=routing_for(pd.spec.engine),
    )


def render(config: RouterConfig) -> tuple[str, str]:
    """The JSON the routers read, and its hash."""
    text = config.model_dump_json(by_alias=True, exclude_none=True, indent=2)
    return text, hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Target:
    """Which ConfigMap a publish writes: the owner's kind, the label naming the owner, the component."""

    kind: str
    label: str
    component: str
    suffix: str

    def name(self, owner: str) -> str:
        return f"{owner}{self.suffix}"


ROUTER = Target(KIND_PD_CLUSTER, LABEL_PD_CLUSTER, "router", "-router-config")
GATEWAY = Target(KIND_PREFILL_CLUSTER, LABEL_PREFILL_CLUSTER, "gateway", "-gateway-config")


@dataclass(frozen=True)
class BuiltFrom:
    """What a config is built from: ``objects``, compared by identity (the cache's frozen models and pod bodies:
    the cache replaces an object that changes and never edits one, and keeps a model whose spec did not change),
    and ``values``, compared by equality (the bounds on ``t``, the names). The same sources build the same
    config, so a config built from them need not be built again to find it unchanged."""

    objects: tuple[object, ...]
    values: tuple[Hashable, ...] = ()

    def same(self, other: BuiltFrom | None) -> bool:
        return (
            other is not None
            and len(self.objects) == len(other.objects)
            and all(a is b for a, b in zip(self.objects, other.objects, strict=True))
            and self.values == other.values
        )


class RouterConfigPublisher:
    """Writes a PDCluster's (or a Managed PrefillCluster's gateway) ConfigMap only when its content changed
    (remembered per owner)."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self._published: dict[tuple[str, str, str], str] = {}
        self._built_from: dict[tuple[str, str, str], BuiltFrom] = {}
        """What the config last published for an owner was built from (when the caller said)."""

    async def publish(self, pd_body: JsonDict, config: RouterConfig) -> str:
        return await self._publish(ROUTER, pd_body, config)

    async def publish_built(self, pd_body: JsonDict, built_from: BuiltFrom, build: Callable[[], RouterConfig]) -> str:
        """:meth:`publish` of ``build()``, unless the config this publisher last published for the PD cluster was
        built from the same sources: then that config is in place, and nothing is built, validated, rendered or
        hashed (at rest, every cycle of every cluster). Anything else — a changed source, a failed or another
        publish since — builds and publishes as :meth:`publish` does."""
        meta = pd_body["metadata"]
        key = (ROUTER.kind, str(meta.get("namespace") or "default"), str(meta["name"]))
        if key in self._published and built_from.same(self._built_from.get(key)):
            return ROUTER.name(key[2])
        return await self._publish(ROUTER, pd_body, build(), built_from)

    async def publish_gateway(self, pfc_body: JsonDict, config: RouterConfig) -> str:
        return await self._publish(GATEWAY, pfc_body, config)

    async def _publish(
        self, target: Target, owner_body: JsonDict, config: RouterConfig, built_from: BuiltFrom | None = None
    ) -> str:
        meta = owner_body["metadata"]
        namespace, owner_name = str(meta.get("namespace") or "default"), str(meta["name"])
        key = (target.kind, namespace, owner_name)
        name = target.name(owner_name)
        text, digest = render(config)
        self._built_from.pop(key, None)
        if self._published.get(key) == digest:
            if built_from is not None:
                self._built_from[key] = built_from
            return name
        owner: dict[str, Any] = {
            "apiVersion": owner_body.get("apiVersion", GROUP_VERSION),
            "kind": target.kind,
            "name": owner_name,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        if meta.get("uid"):
            owner["uid"] = meta["uid"]
        body: JsonDict = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {
                    target.label: owner_name,
                    LABEL_MANAGED_BY: MANAGED_BY_VALUE,
                    LABEL_COMPONENT: target.component,
                },
                "annotations": {ANNOTATION_ROUTER_CONFIG_HASH: digest},
                "ownerReferences": [owner],
            },
            "data": {CONFIG_KEY: text},
        }
        path = api_path("v1", "configmaps", namespace, name)
        try:
            await self.api.patch(path, body)
        except ApiError as exc:
            if exc.status != 404:
                raise
            await self.api.create(api_path("v1", "configmaps", namespace), body)
        self._published[key] = digest
        if built_from is not None:
            self._built_from[key] = built_from
        return name

    async def delete(self, namespace: str, pd_name: str) -> bool:
        return await self._delete(ROUTER, namespace, pd_name)

    async def delete_gateway(self, namespace: str, pfc_name: str) -> bool:
        return await self._delete(GATEWAY, namespace, pfc_name)

    async def _delete(self, target: Target, namespace: str, owner_name: str) -> bool:
        self._published.pop((target.kind, namespace, owner_name), None)
        self._built_from.pop((target.kind, namespace, owner_name), None)
        return await self.api.delete(api_path("v1", "configmaps", namespace, target.name(owner_name)))
