"""The routers' ConfigMap at rest (issue 45): a PD cluster whose sources did not change (the same cached models and
pod bodies, the same bounds on ``t``) is not built, validated, rendered or written again; a changed source is
built, and published when the config it builds differs. Against the Kubernetes API emulator over HTTP."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import yaml

from prfaas_core.api import InterDCLink, ModelProfile, PDCluster, PrefillCluster, RouterConfig
from prfaas_core.policy.threshold import ThresholdBounds
from prfaas_operator.kube import KubeApi, KubeCredentials
from prfaas_operator.router_config import CONFIG_KEY, BuiltFrom, RouterConfigPublisher, build, configmap_name
from prfaas_testbed.k8s_emulator import EmulatorThread

FLEET = Path(__file__).parents[2] / "examples/06-fleet"


def _fleet() -> tuple[PDCluster, ModelProfile, list[InterDCLink], dict[str, PrefillCluster]]:
    docs = [yaml.safe_load(p.read_text()) for p in sorted((FLEET / "region-east").glob("*.yaml"))]
    pd = PDCluster.model_validate(next(d for d in docs if d["kind"] == "PDCluster"))
    links = [InterDCLink.model_validate(d) for d in docs if d["kind"] == "InterDCLink"]
    sites = {d["metadata"]["name"]: PrefillCluster.model_validate(d) for d in docs if d["kind"] == "PrefillCluster"}
    profile = ModelProfile.model_validate(yaml.safe_load((FLEET / "common/model-profile.yaml").read_text()))
    return pd, profile, links, sites


def _pod(name: str, ip: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"prfaas.io/role": "prefill"}}, "status": {"podIP": ip}}


def test_unchanged_sources_build_nothing_and_a_changed_source_still_publishes(
    emu: EmulatorThread, tmp_path: Path
) -> None:
    pd, profile, links, sites = _fleet()
    creds = KubeCredentials.load(str(emu.write_kubeconfig(tmp_path / "kubeconfig")))
    owner = {"apiVersion": "prfaas.io/v1alpha1", "kind": "PDCluster", "metadata": {"name": "east", "uid": "u-1"}}
    built: list[RouterConfig] = []

    def writes() -> int:
        """Requests that write a ConfigMap (the first is a PATCH answered 404, then the POST)."""
        return sum(n for k, n in emu.k8s.requests.items() if k.split()[1] == "configmaps" and k.split()[0] != "GET")

    async def publish(pub: RouterConfigPublisher, pods: list[dict[str, Any]], bounds: ThresholdBounds) -> None:
        def make() -> RouterConfig:
            built.append(build(pd, pods, profile.spec, links, sites, bounds))
            return built[-1]

        sources = BuiltFrom((pd, profile, *links, *sites.values(), *pods), (bounds, len(links), tuple(sites)))
        await pub.publish_built(owner, sources, make)

    async def scenario() -> None:
        api = KubeApi(creds, retries=0)
        try:
            pub = RouterConfigPublisher(api)
            pods, bounds = [_pod("e0", "10.0.0.1"), _pod("e1", "10.0.0.2")], ThresholdBounds(19_000)
            path = f"/api/v1/namespaces/default/configmaps/{configmap_name('east')}"

            async def published() -> dict[str, Any]:
                cm = await api.get(path)
                assert cm is not None
                return dict(json.loads(cm["data"][CONFIG_KEY]))

            await publish(pub, pods, bounds)
            first = writes()
            assert len(built) == 1 and first > 0 and (await published())["thresholdMinTokens"] == 19_000
            await publish(pub, list(pods), ThresholdBounds(19_000))  # the same objects, equal bounds: nothing
            assert len(built) == 1 and writes() == first
            await publish(pub, copy.deepcopy(pods), bounds)  # new bodies, same content: built, not written
            assert len(built) == 2 and writes() == first
            await publish(pub, pods, ThresholdBounds(25_000))  # new bounds: published
            assert len(built) == 3 and writes() == first + 1 and (await published())["thresholdMinTokens"] == 25_000
            moved = [pods[0], _pod("e1", "10.0.0.9")]  # a pod's new body (a new IP): published
            await publish(pub, moved, ThresholdBounds(25_000))
            assert len(built) == 4 and writes() == first + 2
            assert "http://10.0.0.9:8000" in {e["url"] for e in (await published())["endpoints"]}
            await publish(pub, moved, ThresholdBounds(25_000))
            assert len(built) == 4 and writes() == first + 2
            assert await pub.delete("default", "east")  # deleted: the next publish builds and writes it again
            await publish(pub, moved, ThresholdBounds(25_000))
            assert len(built) == 5 and writes() > first + 2 and (await published())["thresholdMinTokens"] == 25_000
        finally:
            await api.aclose()

    asyncio.run(scenario())
