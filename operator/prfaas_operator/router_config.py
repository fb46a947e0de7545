"""The routers' configuration: one ConfigMap per PDCluster holding the core's RouterConfig as JSON.

The operator is its one writer. Routers mount it (kubelet refreshes the file) and hot-reload it; they never
call the Kubernetes API on the hot path. Secrets named by a remote PrefillCluster are expected mounted at
``/var/run/prfaas/secrets/<secret>/<key>`` in the router pods (the Helm chart does so).
"""

from __future__ import annotations

import hashlib
from typing import Any

from prfaas_core.api import (
    InterDCLink,
    ModelProfileSpec,
    PDCluster,
    PrefillCluster,
    RemoteGateway,
    RouterConfig,
    RouterEndpoint,
    RouterLink,
)
from prfaas_core.names import (
    ANNOTATION_ROUTER_CONFIG_HASH,
    LABEL_COMPONENT,
    LABEL_DRAINING,
    LABEL_MANAGED_BY,
    LABEL_PD_CLUSTER,
    LABEL_ROLE,
    MANAGED_BY_VALUE,
)

from .kube import ApiError, JsonDict, KubeApi, api_path

SECRETS_DIR = "/var/run/prfaas/secrets"
CONFIG_KEY = "router-config.json"
DEFAULT_ENGINE_PORT = 8000
T_MAX = 1 << 30


def configmap_name(pd_name: str) -> str:
    return f"{pd_name}-router-config"


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


def build(
    pd: PDCluster,
    pods: list[JsonDict],
    model: ModelProfileSpec,
    links: list[InterDCLink],
    prefill_clusters: dict[str, PrefillCluster],
    threshold_min_tokens: int,
    threshold_max_tokens: int = T_MAX,
) -> RouterConfig:
    endpoints, draining = [], []
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        name = str(pod["metadata"]["name"])
        if labels.get(LABEL_DRAINING) == "true":
            draining.append(name)
        url = pod_url(pod)
        role = labels.get(LABEL_ROLE)
        if url is not None:
            endpoints.append(RouterEndpoint(name=name, url=url, role=role if role in ("prefill", "decode") else "both"))
    remotes = []
    for link in links:
        pfc = prefill_clusters.get(link.spec.prefill_cluster_ref.name)
        if pfc is None or pfc.spec.mode != "Remote" or pfc.spec.endpoint is None:
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
        )
        for link in links
    ]
    return RouterConfig(
        pd_cluster=pd.metadata.name,
        endpoints=endpoints,
        draining=draining,
        remotes=remotes,
        links=router_links,
        threshold_min_tokens=threshold_min_tokens,
        threshold_max_tokens=max(threshold_min_tokens, threshold_max_tokens),
        model=model,
    )


def render(config: RouterConfig) -> tuple[str, str]:
    """The JSON the routers read, and its hash."""
    text = config.model_dump_json(by_alias=True, exclude_none=True, indent=2)
    return text, hashlib.sha256(text.encode()).hexdigest()[:16]


class RouterConfigPublisher:
    """Writes a PDCluster's ConfigMap only when its content changed (remembered per cluster)."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self._published: dict[tuple[str, str], str] = {}

    async def publish(self, pd_body: JsonDict, config: RouterConfig) -> str:
        meta = pd_body["metadata"]
        namespace, pd_name = str(meta.get("namespace") or "default"), str(meta["name"])
        name = configmap_name(pd_name)
        text, digest = render(config)
        if self._published.get((namespace, pd_name)) == digest:
            return name
        owner: dict[str, Any] = {
            "apiVersion": pd_body.get("apiVersion", "prfaas.io/v1alpha1"),
            "kind": "PDCluster",
            "name": pd_name,
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
                "labels": {LABEL_PD_CLUSTER: pd_name, LABEL_MANAGED_BY: MANAGED_BY_VALUE, LABEL_COMPONENT: "router"},
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
        self._published[(namespace, pd_name)] = digest
        return name

    async def delete(self, namespace: str, pd_name: str) -> bool:
        self._published.pop((namespace, pd_name), None)
        return await self.api.delete(api_path("v1", "configmaps", namespace, configmap_name(pd_name)))
