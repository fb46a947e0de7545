"""The Helm charts with a real helm binary (scripts/helm-tools.sh): lint --strict and template over every
values file, kubernetes-validate --strict (1.30) and yamllint on what they render, the values schema's teeth,
documentation of every value, the operator's RBAC against the calls a real operator run made (API emulator's
request log), and that every container runs an entrypoint of the one image (the image itself: test_image.py)."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from os.path import dirname
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from yamllint import config as yamllint_config
from yamllint import linter

from prfaas_testbed.rbac_log import (
    README,
    RULES_FILE,
    Call,
    allowed,
    grants_of,
    load_rules,
    rbac_table,
    readme_table,
    record_operator_calls,
)

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "prfaas"
CRD_CHART = REPO / "helm" / "prfaas-crds"
NAMESPACE = "prfaas"
VALUES = [
    None,
    *sorted(REPO.glob("examples/**/values*.yaml")),
    *sorted((REPO / "tests" / "data" / "helm").glob("values-*.yaml")),
]
CUSTOM_GROUPS = ("monitoring.coreos.com/", "prfaas.io/", "leaderworkerset.x-k8s.io/")
"""Kinds kubernetes-validate has no schema for (it only warns on them): checked structurally below."""
K8S_VERSION = "1.30.0"
RENDERED_LINT = yamllint_config.YamlLintConfig(
    "extends: default\n"
    "rules:\n"
    "  line-length: disable\n"  # the dashboard JSON and long descriptions
    "  document-start: disable\n"
    "  comments: {min-spaces-from-content: 1}\n"
    "  truthy: {check-keys: false}\n"
    "  indentation: {indent-sequences: whatever}\n"  # toYaml writes block sequences unindented
)
SOURCE_LINT = yamllint_config.YamlLintConfig(
    "extends: default\n"
    "rules:\n"
    "  line-length: {max: 120}\n"
    "  document-start: disable\n"
    "  comments: {min-spaces-from-content: 1}\n"
    "  truthy: {check-keys: false}\n"
    "  braces: {max-spaces-inside: 1}\n"
    "  brackets: {max-spaces-inside: 1}\n"
)

pytestmark = pytest.mark.timeout(300)


def vid(path: Path | None) -> str:
    return "chart-defaults" if path is None else str(path.relative_to(REPO))


@pytest.fixture(scope="session")
def helm() -> str:
    proc = subprocess.run(["bash", str(REPO / "scripts" / "helm-tools.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120)


def render_text(helm: str, chart: Path, values: Path | None = None, *extra: str) -> str:
    args = ["template", "prfaas", str(chart), "-n", NAMESPACE, *extra]
    if values is not None:
        args += ["-f", str(values)]
    proc = run_helm(helm, *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def render(helm: str, chart: Path, values: Path | None = None, *extra: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(render_text(helm, chart, values, *extra)) if d]


def kinds(docs: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in docs:
        out[d["kind"]] = out.get(d["kind"], 0) + 1
    return dict(sorted(out.items()))


def find(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    hits = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(hits) == 1, f"{kind} *{name_suffix}: {[d['metadata']['name'] for d in hits]}"
    return hits[0]


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(doc["spec"]["template"]["spec"]["containers"])


# --- the CRD chart ----------------------------------------------------------------------------------------------


def test_chart_file_copies_are_in_sync() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "sync_chart_files.py"), "--check"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def test_crd_chart_renders_every_generated_crd_unchanged_and_kept(helm: str) -> None:
    docs = {d["metadata"]["name"]: d for d in render(helm, CRD_CHART)}
    generated = {p.name.removesuffix(".yaml"): yaml.safe_load(p.read_text()) for p in (REPO / "crds").glob("*.yaml")}
    assert set(docs) == set(generated)
    for name, crd in generated.items():
        got = docs[name]
        assert got["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        labels = got["metadata"]["labels"]
        assert labels["helm.sh/chart"].startswith("prfaas-crds-") and labels["app.kubernetes.io/instance"] == "prfaas"
        for key, value in crd["metadata"]["labels"].items():
            assert labels[key] == value
        assert got["spec"] == crd["spec"], name  # schemas byte-for-byte as generated (text insertion only)
        assert {k: v for k, v in got.items() if k != "metadata"} == {k: v for k, v in crd.items() if k != "metadata"}
    off = render(helm, CRD_CHART, None, "--set", "keep=false")
    assert all("annotations" not in d["metadata"] for d in off)


# --- lint, template, validate -----------------------------------------------------------------------------------


def test_crd_chart_lints_strict(helm: str) -> None:
    proc = run_helm(helm, "lint", "--strict", str(CRD_CHART))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("values", VALUES, ids=vid)
def test_chart_lints_strict(helm: str, values: Path | None) -> None:
    proc = run_helm(helm, "lint", "--strict", str(CHART), "-n", NAMESPACE, *(["-f", str(values)] if values else []))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("values", VALUES, ids=vid)
def test_rendered_manifests_are_valid_kubernetes_and_clean_yaml(helm: str, values: Path | None) -> None:
    text = render_text(helm, CHART, values)
    problems = [f"{p.line}: {p.desc}" for p in linter.run(text, RENDERED_LINT) if p.level == "error"]
    assert not problems, problems
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert docs
    for doc in docs:
        if doc["apiVersion"].startswith(CUSTOM_GROUPS):
            assert doc["kind"] in {"ServiceMonitor", "PodMonitor", "PrometheusRule", "LeaderWorkerSet"}, doc["kind"]
            assert doc["spec"]
            continue
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message}") from None
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == "prfaas"


def test_example_resources_validate() -> None:
    """The resources the two-region install applies with the example values (examples/01-two-region; its engine
    workloads are the chart's, checked against the operator's rendering in test_examples.py) and the demo's."""
    ex01 = REPO / "examples" / "01-two-region"
    for files in (
        [ex01 / "common", ex01 / "region-a"],
        [ex01 / "common", ex01 / "region-b"],
        [REPO / "examples/03-helm/demo/resources.yaml"],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "prfaas_cli.main", "validate", "--strict-references", *map(str, files)],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_source_yaml_is_lint_clean() -> None:
    paths = [
        CHART / "values.yaml",
        CHART / "files" / "operator-rbac.yaml",
        CRD_CHART / "values.yaml",
        REPO / "alerts" / "prfaas-rules.yaml",
        *sorted(REPO.glob("examples/03-helm/**/*.yaml")),
        *sorted((REPO / "tests" / "data" / "helm").glob("*.yaml")),
    ]
    for path in paths:
        problems = [f"{p.line}: {p.desc}" for p in linter.run(path.read_text(), SOURCE_LINT) if p.level == "error"]
        assert not problems, f"{path.relative_to(REPO)}: {problems}"


def test_objects_rendered_per_region(helm: str) -> None:
    """The two-region install of docs/install.md (examples/03-helm values): what each region gets."""
    region_a = kinds(render(helm, CHART, REPO / "examples/03-helm/region-a/values.yaml"))
    region_b = kinds(render(helm, CHART, REPO / "examples/03-helm/region-b/values.yaml"))
    common = {
        "ClusterRole": 1, "ClusterRoleBinding": 1, "ConfigMap": 2, "Deployment": 2, "NetworkPolicy": 2,
        "PodDisruptionBudget": 2, "PodMonitor": 2, "PrometheusRule": 1, "Role": 2, "RoleBinding": 2, "Service": 2,
        "ServiceAccount": 1, "ServiceMonitor": 1,
    }  # fmt: skip
    # region A: the dashboard only (the gateway's RouterConfig is the operator's); region B: + router settings
    # region A's gateway: a StatefulSet with a headless Service naming each replica for its peers
    gateway_a = {"ConfigMap": 1, "Deployment": 1, "StatefulSet": 1, "Service": 3}
    # region B's routers: a headless Service through which the replicas find each other and share their books
    router_b = {"Service": 3}
    # each region's engines (engines.enabled): a LeaderWorkerSet, its NetworkPolicy, its Services (cross-region KV)
    engines = {"LeaderWorkerSet": 1, "NetworkPolicy": 3}
    assert region_a == dict(sorted({**common, **gateway_a, **engines, "Service": 5}.items()))
    assert region_b == dict(sorted({**common, **router_b, **engines, "Service": 5}.items()))
    assert sum(region_a.values()) == 25 and sum(region_b.values()) == 26 and len(render(helm, CRD_CHART)) == 4
    demo = render(helm, CHART, REPO / "examples/03-helm/demo/values.yaml")
    assert len(demo) == 30  # with the router replicas' generated books token (no tokenSecret there)
    assert [d["metadata"]["name"] for d in demo if d["kind"] == "Secret"] == ["prfaas-router-peers-token"]


# --- values: schema and documentation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        "operator.replicas=0",
        "operator.bogus=1",
        "router.pdCluster=Not_A_Name",
        "router.logLevel=verbose",
        "router.workers=0",
        "gateway.endpoints[0].name=x,gateway.endpoints[0].url=http://x",  # the operator's now, not a value
        "gateway.modelProfile.servedModelName=m",
        "gateway.hardware.accelerator=H200",
        "operator.resyncSeconds=0",
        "monitoring.podMonitor.interval=often",
        "image.pullPolicy=Sometimes",
        "demo.pd.hardware=A100",
        "networkPolicy.enabled=maybe",
    ],
)
def test_values_schema_rejects_bad_values(helm: str, bad: str) -> None:
    proc = run_helm(helm, "template", "prfaas", str(CHART), "--set", bad)
    assert proc.returncode != 0
    assert "schema" in proc.stderr.lower(), proc.stderr


def test_chart_rejects_inconsistent_settings_with_a_message(helm: str) -> None:
    cases = {
        ("router.enabled=true",): "router.pdCluster is required",
        ("gateway.enabled=true", "gateway.tls.enabled=false"): "gateway.prefillCluster is required",
        ("gateway.enabled=true", "gateway.prefillCluster=p"): "gateway.tls.secretName",
        ("operator.lease.renewSeconds=20",): "renewSeconds must be below",
    }
    for sets, message in cases.items():
        proc = run_helm(helm, "template", "prfaas", str(CHART), *[a for s in sets for a in ("--set", s)])
        assert proc.returncode != 0 and message in proc.stderr, (sets, proc.stderr)


def _schema_leaves(schema: dict[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for key, sub in (schema.get("properties") or {}).items():
        path = (*prefix, key)
        if "properties" in sub:
            yield from _schema_leaves(sub, path)
        else:
            yield path


def test_every_value_is_documented_and_the_schema_is_strict() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    lines = (CHART / "values.yaml").read_text().splitlines()
    # where each key sits: indentation-based path of every `key:` line
    located: dict[tuple[str, ...], int] = {}
    stack: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        m = re.match(r"^( *)([A-Za-z][A-Za-z0-9_]*):", line)
        if not m:
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m.group(2)))
        located.setdefault(tuple(k for _, k in stack), i)
    for path in _schema_leaves(schema):
        if path == ("global",):
            continue
        node: Any = values
        for key in path:
            assert isinstance(node, dict) and key in node, f"schema key {'.'.join(path)} missing from values.yaml"
            node = node[key]
        i = located[path]
        assert lines[i - 1].lstrip().startswith("#"), f"{'.'.join(path)} (values.yaml:{i + 1}) has no comment"

    def strict(node: dict[str, Any], where: str) -> None:
        if "properties" in node:
            assert node.get("additionalProperties") is False, f"{where} accepts unknown keys"
            for key, sub in node["properties"].items():
                strict(sub, f"{where}.{key}")

    strict(schema, "values")


# --- what the components get ------------------------------------------------------------------------------------


GATEWAY_INSTALLS = [
    # (chart values, the custom resources applied with them, files holding the PrefillCluster's workload)
    (
        "examples/03-helm/region-a/values.yaml",
        ["examples/01-two-region/common/model-profile.yaml", "examples/01-two-region/region-a/prefill-cluster.yaml"],
        [],
    ),
    ("examples/03-helm/demo/values.yaml", ["examples/03-helm/demo/resources.yaml"], []),
]


@pytest.mark.parametrize(("values", "resources", "workloads"), GATEWAY_INSTALLS, ids=["region-a", "demo"])
def test_gateway_mounts_the_operators_configmap_and_the_chart_never_renders_it(
    helm: str, values: str, resources: list[str], workloads: list[str]
) -> None:
    """The gateway reads the RouterConfig the operator writes for its Managed PrefillCluster (router_config.py
    build_gateway): the ConfigMap name and key, and the token and TLS files where the chart mounts the Secrets
    the PrefillCluster names. The operator's output for the example's own objects parses as a RouterConfig."""
    from prfaas_core.api import ModelProfileSpec, PrefillCluster
    from prfaas_operator.router_config import CONFIG_KEY, GATEWAY_DIR, build_gateway, gateway_configmap_name
    from prfaas_operator.router_config import render as render_config
    from prfaas_router.state.config import parse_config

    docs = render(helm, CHART, REPO / values)
    pfc_name = yaml.safe_load((REPO / values).read_text())["gateway"]["prefillCluster"]
    operator_cm = gateway_configmap_name(pfc_name)
    assert not [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-gateway-config")]
    deploy = find(docs, "StatefulSet", "-gateway")
    pod = deploy["spec"]["template"]["spec"]
    assert "checksum/config" not in (deploy["spec"]["template"]["metadata"].get("annotations") or {})
    volume = next(v for v in pod["volumes"] if v.get("configMap", {}).get("name") == operator_cm)
    assert volume["configMap"]["optional"] is True and "items" not in volume["configMap"]
    gateway = containers(deploy)[0]
    mount = next(m for m in gateway["volumeMounts"] if m["name"] == volume["name"])
    args = gateway["args"]
    assert args[0] == "router" and args[args.index("--config") + 1] == f"{mount['mountPath']}/{CONFIG_KEY}"
    assert gateway["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    # started before the operator wrote its config, it waits, alive and not ready; it serves plain HTTP then, so
    # the startup probe (HTTPS) holds liveness off until its config, which names the TLS files, is in force
    assert "--wait-for-config" in args and gateway["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert gateway["startupProbe"]["httpGet"]["scheme"] == "HTTPS"
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v and v["name"] != "peer-ca"}
    mounted = {secrets[m["name"]]: m["mountPath"] for m in gateway["volumeMounts"] if m["name"] in secrets}

    objects = [d for f in resources for d in yaml.safe_load_all((REPO / f).read_text()) if d]
    body = next(o for o in objects if o["kind"] == "PrefillCluster" and o["metadata"]["name"] == pfc_name)
    pfc = PrefillCluster.model_validate(body)
    assert pfc.spec.mode == "Managed" and pfc.spec.workload is not None and pfc.spec.endpoint is not None
    profile = next(o for o in objects if o["kind"] == "ModelProfile")
    assert profile["metadata"]["name"] == pfc.spec.model_profile_ref.name
    token, tls = pfc.spec.endpoint.token_secret_ref, pfc.spec.endpoint.tls_secret_ref
    assert token is not None and tls is not None
    assert mounted == {token.name: f"{GATEWAY_DIR}/token", tls.name: f"{GATEWAY_DIR}/tls"}

    # the PrefillCluster's workload (rendered by the chart's demo, or the example's vLLM manifest): its pods carry
    # the label the operator lists them by; two of them, as the operator would see them
    candidates = docs + [d for f in workloads for d in yaml.safe_load_all((REPO / f).read_text()) if d]
    workload = next(
        d for d in candidates if d["kind"] == pfc.spec.workload.kind and d["metadata"]["name"] == pfc.spec.workload.name
    )
    spec = workload["spec"]
    template = (
        spec["leaderWorkerTemplate"]["workerTemplate"] if workload["kind"] == "LeaderWorkerSet" else spec["template"]
    )
    assert template["metadata"]["labels"]["prfaas.io/prefill-cluster"] == pfc_name
    pods = [
        {"metadata": {"name": f"{pfc.spec.workload.name}-{i}", "labels": template["metadata"]["labels"]},
         "spec": template["spec"], "status": {"podIP": f"10.0.0.{i + 1}"}}
        for i in range(2)
    ]  # fmt: skip
    text, _ = render_config(build_gateway(pfc, pods, ModelProfileSpec.model_validate(profile["spec"])))
    config = parse_config(text, CONFIG_KEY)
    assert config.mode == "gateway" and config.gateway is not None and config.gateway.prefill_cluster == pfc_name
    assert [(e.url, e.role) for e in config.endpoints] == [
        ("http://10.0.0.1:8000", "prefill"),
        ("http://10.0.0.2:8000", "prefill"),
    ]
    assert config.gateway.token_file == f"{mounted[token.name]}/{token.key}"
    assert config.gateway.tls_cert_file == f"{mounted[tls.name]}/tls.crt"
    assert config.gateway.tls_key_file == f"{mounted[tls.name]}/tls.key"
    ls = pfc.spec.link_scheduling  # the region-a example schedules its link at the gateway
    if values.startswith("examples/03-helm/region-a"):
        assert ls is not None and config.gateway.admission is not None
        assert config.gateway.admission.link == ls.link and config.gateway.admission.replicas == ls.replicas
        assert [(x.name, x.capacity_gbps, x.max_utilization) for x in config.links] == [
            (ls.link, ls.capacity_gbps, ls.max_utilization)
        ]
        assert config.gateway.admission.peers == ls.peers and ls.replicas == deploy["spec"]["replicas"]


def test_gateway_replicas_reach_each_other_by_the_names_the_prefill_cluster_lists(helm: str) -> None:
    """Gateway replicas lend each other their share of the link only if each can reach the others by the URLs in
    the PrefillCluster's linkScheduling.peers: the example lists exactly the StatefulSet's pods under its headless
    Service (what `helm install` prints), the peers Service selects the gateway pods without the ServiceMonitor
    scraping them twice, the NetworkPolicy admits the replicas to each other (region A admits only region B's
    CIDR otherwise), and peerCaFile is where the chart mounts the gateway's CA."""
    from prfaas_core.api import PrefillCluster

    values = REPO / "examples/03-helm/region-a/values.yaml"
    docs = render(helm, CHART, values)
    sts = find(docs, "StatefulSet", "-gateway")
    headless = find(docs, "Service", "-gateway-peers")
    port = containers(sts)[0]["ports"][0]
    assert sts["spec"]["serviceName"] == headless["metadata"]["name"]
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert headless["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    assert [(p["targetPort"], p["port"]) for p in headless["spec"]["ports"]] == [(port["name"], port["containerPort"])]
    names = [f"{sts['metadata']['name']}-{i}.{headless['metadata']['name']}.{NAMESPACE}.svc" for i in range(2)]
    urls = [f"https://{n}:{port['containerPort']}" for n in names]

    body = yaml.safe_load((REPO / "examples/01-two-region/region-a/prefill-cluster.yaml").read_text())
    ls = PrefillCluster.model_validate(body).spec.link_scheduling
    assert ls is not None and ls.replicas == sts["spec"]["replicas"] == 2
    assert ls.peers == urls

    proc = run_helm(helm, "install", "prfaas", str(CHART), "-n", NAMESPACE, "--dry-run=client", "-f", str(values))
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert all(f"- {u}" in notes for u in urls) and f"peerCaFile: {ls.peer_ca_file}" in notes

    monitor = find(docs, "ServiceMonitor")
    selected = {v for e in monitor["spec"]["selector"]["matchExpressions"] for v in e.get("values", [])}
    component = "app.kubernetes.io/component"
    assert headless["metadata"]["labels"][component] not in selected
    assert find(docs, "Service", "-gateway")["metadata"]["labels"][component] in selected

    policy = find(docs, "NetworkPolicy", "-gateway")
    peer_rules = [
        r for r in policy["spec"]["ingress"]
        if {"podSelector": {"matchLabels": sts["spec"]["selector"]["matchLabels"]}} in r.get("from", [])
    ]  # fmt: skip
    assert peer_rules and peer_rules[0]["ports"] == [{"port": port["name"], "protocol": "TCP"}]

    pod = sts["spec"]["template"]["spec"]
    ca = next(v for v in pod["volumes"] if v["name"] == "peer-ca")["secret"]
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["gateway"]["tls"]
    tls = {**defaults, **yaml.safe_load(values.read_text())["gateway"]["tls"]}
    assert ca["secretName"] == tls["caSecretName"] and ca["items"] == [{"key": tls["caKey"], "path": "ca.crt"}]
    mount = next(m for m in containers(sts)[0]["volumeMounts"] if m["name"] == "peer-ca")
    assert ls.peer_ca_file == f"{mount['mountPath']}/ca.crt"


def test_router_replicas_find_each_other_to_share_their_books(helm: str) -> None:
    """The router replicas resolve a headless Service that selects exactly their pods to each other's addresses
    (--peers-dns from the settings ConfigMap, on the container's own port), the ServiceMonitor does not scrape them
    twice through it, and the NetworkPolicy admits the replicas to each other; router.replicaSync.enabled=false
    leaves every piece out and the flag empty (the router then shares nothing)."""
    from prfaas_router.state.peers import parse_peers_dns

    values = REPO / "examples/03-helm/region-b/values.yaml"
    docs = render(helm, CHART, values)
    deploy = find(docs, "Deployment", "-router")
    router = containers(deploy)[0]
    port = next(p for p in router["ports"] if p["name"] == "http")
    headless = find(docs, "Service", "-router-peers")
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert headless["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]
    assert [(p["targetPort"], p["port"]) for p in headless["spec"]["ports"]] == [("http", port["containerPort"])]
    args = router["args"]
    assert args[args.index("--peers-dns") + 1] == "$(PRFAAS_ROUTER_PEERS_DNS)"
    settings = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("router-settings"))
    dns = settings["data"]["PRFAAS_ROUTER_PEERS_DNS"]
    assert parse_peers_dns(dns) == (f"{headless['metadata']['name']}.{NAMESPACE}.svc", port["containerPort"])

    monitor = find(docs, "ServiceMonitor")
    selected = {v for e in monitor["spec"]["selector"]["matchExpressions"] for v in e.get("values", [])}
    component = "app.kubernetes.io/component"
    assert headless["metadata"]["labels"][component] not in selected
    assert find(docs, "Service", "-router")["metadata"]["labels"][component] in selected

    policy = find(docs, "NetworkPolicy", "-router")
    peer_rules = [
        r for r in policy["spec"]["ingress"]
        if {"podSelector": {"matchLabels": deploy["spec"]["selector"]["matchLabels"]}} in r.get("from", [])
    ]  # fmt: skip
    assert peer_rules and peer_rules[0]["ports"] == [{"port": "http", "protocol": "TCP"}]

    # the shared books token: router.replicaSync.tokenSecret mounted where the flag's file points
    assert args[args.index("--peers-token-file") + 1] == "$(PRFAAS_ROUTER_PEERS_TOKEN_FILE)"
    token_file = settings["data"]["PRFAAS_ROUTER_PEERS_TOKEN_FILE"]
    pod = deploy["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == "router-peers-token")
    assert volume["secret"]["items"] == [{"key": "token", "path": "token"}]
    mount = next(m for m in router["volumeMounts"] if m["name"] == volume["name"])
    assert token_file == f"{mount['mountPath']}/token" and mount["readOnly"] is True
    assert not [d for d in docs if d["kind"] == "Secret" and "router-peers-token" in d["metadata"]["name"]]
    # no tokenSecret: the chart generates one (a random token, kept across upgrades) and mounts it the same way
    generated = render(helm, CHART, values, "--set", "router.replicaSync.tokenSecret=")
    secret = find(generated, "Secret", "-router-peers-token")
    assert len(base64.b64decode(secret["data"]["token"])) == 48
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    gen_settings = find(generated, "ConfigMap", "-router-settings")
    assert gen_settings["data"]["PRFAAS_ROUTER_PEERS_TOKEN_FILE"] == token_file
    gen_pod = find(generated, "Deployment", "-router")["spec"]["template"]["spec"]
    assert secret["metadata"]["name"] in {v.get("secret", {}).get("secretName") for v in gen_pod["volumes"]}
    again = find(render(helm, CHART, values, "--set", "router.replicaSync.tokenSecret="), "Secret", "-peers-token")
    assert again["data"]["token"] != secret["data"]["token"]  # helm template has no cluster to look up: a fresh one

    off = render(helm, CHART, values, "--set", "router.replicaSync.enabled=false")
    assert not [d for d in off if d["metadata"]["name"].endswith("-router-peers")]
    off_settings = next(
        d for d in off if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("router-settings")
    )
    assert off_settings["data"]["PRFAAS_ROUTER_PEERS_DNS"] == "" and parse_peers_dns("") is None
    off_gen = render(helm, CHART, values, "--set", "router.replicaSync.enabled=false,router.replicaSync.tokenSecret=")
    assert not [d for d in off_gen if d["kind"] == "Secret"]  # no replica shares books: no token is made
    assert find(off_gen, "ConfigMap", "-router-settings")["data"]["PRFAAS_ROUTER_PEERS_TOKEN_FILE"] == ""
    off_policy = find(off, "NetworkPolicy", "-router")
    assert all("podSelector" not in str(r.get("from", "")) for r in off_policy["spec"]["ingress"])


def test_router_workers_are_one_value_the_router_and_the_sidecar_pass(helm: str) -> None:
    """router.workers reaches ``prfaas router --workers`` through the settings ConfigMap (the standalone router and
    the sidecar alike), and with more than one the pod gets a writable /tmp (the root filesystem is read-only) for
    the workers' shared metrics folder and token; one worker renders no such volume."""
    from prfaas_cli.main import build_parser

    values = REPO / "examples/03-helm/region-b/values.yaml"
    docs = render(helm, CHART, values, "--set", "router.workers=3")
    assert find(docs, "ConfigMap", "-router-settings")["data"]["PRFAAS_ROUTER_WORKERS"] == "3"
    deploy = find(docs, "Deployment", "-router")
    router = containers(deploy)[0]
    args = router["args"]
    assert args[args.index("--workers") + 1] == "$(PRFAAS_ROUTER_WORKERS)"
    settings = find(docs, "ConfigMap", "-router-settings")["data"]
    parsed = build_parser().parse_args([re.sub(r"\$\((\w+)\)", lambda m: settings[m[1]], a) for a in args])
    assert parsed.workers == 3
    tmp = next(m for m in router["volumeMounts"] if m["mountPath"] == "/tmp")
    volume = next(v for v in deploy["spec"]["template"]["spec"]["volumes"] if v["name"] == tmp["name"])
    assert volume["emptyDir"]["medium"] == "Memory"
    assert router["securityContext"]["readOnlyRootFilesystem"] is True
    demo = render(helm, CHART, REPO / "tests/data/helm/values-sidecar-demo.yaml", "--set", "router.workers=3")
    engines = find(demo, "Deployment", "pd-engines")
    sidecar = next(c for c in containers(engines) if c["name"] == "prfaas-router")
    assert sidecar["args"][sidecar["args"].index("--workers") + 1] == "$(PRFAAS_ROUTER_WORKERS)"
    assert find(demo, "ConfigMap", "-router-settings")["data"]["PRFAAS_ROUTER_WORKERS"] == "3"
    side_tmp = next(m for m in sidecar["volumeMounts"] if m["mountPath"] == "/tmp")
    assert side_tmp["name"] in {v["name"] for v in engines["spec"]["template"]["spec"]["volumes"]}
    one = find(render(helm, CHART, values), "Deployment", "-router")
    assert all(m["mountPath"] != "/tmp" for m in containers(one)[0]["volumeMounts"])


def test_router_mounts_the_operators_configmap_and_the_chart_never_renders_it(helm: str) -> None:
    from prfaas_operator.router_config import CONFIG_KEY, SECRETS_DIR, configmap_name

    docs = render(helm, CHART, REPO / "examples/03-helm/region-b/values.yaml")
    operator_cm = configmap_name("pd-h20")
    assert not [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == operator_cm]
    deploy = find(docs, "Deployment", "-router")
    pod = deploy["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v.get("configMap", {}).get("name") == operator_cm)
    assert volume["configMap"]["optional"] is True
    router = containers(deploy)[0]
    settings = find(docs, "ConfigMap", "-router-settings")
    assert router["envFrom"] == [{"configMapRef": {"name": settings["metadata"]["name"]}}]
    config_path = settings["data"]["PRFAAS_ROUTER_CONFIG"]
    mount = next(m for m in router["volumeMounts"] if m["name"] == volume["name"])
    assert config_path == f"{mount['mountPath']}/{CONFIG_KEY}"
    secret_mounts = {m["mountPath"] for m in router["volumeMounts"]} - {mount["mountPath"]}
    peers_token = dirname(settings["data"]["PRFAAS_ROUTER_PEERS_TOKEN_FILE"])  # router.replicaSync.tokenSecret
    assert secret_mounts == {f"{SECRETS_DIR}/region-a-gateway-token", f"{SECRETS_DIR}/region-a-gateway-ca", peers_token}
    assert router["args"][0] == "router" and "$(PRFAAS_ROUTER_CONFIG)" in router["args"]
    # started before the operator wrote its config, it waits (alive, /ready 503 with the reason): no restarts
    assert "--wait-for-config" in router["args"] and router["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert "checksum/settings" in deploy["spec"]["template"]["metadata"]["annotations"]


def test_the_sidecar_named_template_is_what_demo_engine_pods_carry(helm: str) -> None:
    docs = render(helm, CHART, REPO / "tests/data/helm/values-sidecar-demo.yaml")
    engines = find(docs, "Deployment", "pd-engines")
    by_name = {c["name"]: c for c in containers(engines)}
    assert set(by_name) == {"engine", "prfaas-router"}
    assert by_name["engine"]["ports"][0]["name"] == "http"  # the port the operator addresses
    assert by_name["prfaas-router"]["ports"] == [{"name": "router", "containerPort": 8100, "protocol": "TCP"}]
    volumes = {v["name"]: v for v in engines["spec"]["template"]["spec"]["volumes"]}
    assert volumes["prfaas-router-config"]["configMap"]["name"] == "pd-demo-router-config"
    assert "role" not in str(engines["spec"]["selector"])  # the operator flips roles: never in a selector
    assert not [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-router")]
    # the sidecars find each other through a headless Service selecting the PD cluster's engine pods
    from prfaas_router.state.peers import parse_peers_dns

    peers = find(docs, "Service", "-router-sidecar-peers")
    assert peers["spec"]["clusterIP"] == "None"
    pod_labels = engines["spec"]["template"]["metadata"]["labels"]
    assert (
        peers["spec"]["selector"] == {"prfaas.io/pd-cluster": "pd-demo"}
        and pod_labels["prfaas.io/pd-cluster"] == "pd-demo"
    )
    assert [(p["targetPort"], p["port"]) for p in peers["spec"]["ports"]] == [("router", 8100)]
    # their books token: the chart's generated Secret (no tokenSecret set), mounted where the settings point
    token_secret = find(docs, "Secret", "-router-peers-token")["metadata"]["name"]
    assert volumes["prfaas-router-peers-token"]["secret"]["secretName"] == token_secret
    token_file = find(docs, "ConfigMap", "-router-settings")["data"]["PRFAAS_ROUTER_PEERS_TOKEN_FILE"]
    assert token_file == "/var/run/prfaas/router/peers/token"
    sidecar = by_name["prfaas-router"]
    assert sidecar["args"][sidecar["args"].index("--peers-dns") + 1] == "$(PRFAAS_ROUTER_PEERS_DNS)"
    assert "--wait-for-config" in sidecar["args"]
    env = {e["name"]: e["value"] for e in sidecar["env"]}  # env wins over the settings' envFrom
    assert parse_peers_dns(env["PRFAAS_ROUTER_PEERS_DNS"]) == (f"{peers['metadata']['name']}.{NAMESPACE}.svc", 8100)
    off = render(
        helm, CHART, REPO / "tests/data/helm/values-sidecar-demo.yaml", "--set", "sidecar.replicaSync.enabled=false"
    )
    off_sidecar = next(c for c in containers(find(off, "Deployment", "pd-engines")) if c["name"] == "prfaas-router")
    assert {e["name"]: e["value"] for e in off_sidecar["env"]}["PRFAAS_ROUTER_PEERS_DNS"] == ""
    assert not [d for d in off if d["metadata"]["name"].endswith("-router-sidecar-peers")]


def test_operator_is_one_active_replica_through_its_lease(helm: str) -> None:
    docs = render(helm, CHART, REPO / "examples/03-helm/region-b/values.yaml")
    deploy = find(docs, "Deployment", "-operator")
    args = containers(deploy)[0]["args"]
    lease = args[args.index("--lease-name") + 1]
    assert args[args.index("--identity") + 1] == "$(POD_NAME)" and deploy["spec"]["replicas"] == 2
    assert args[args.index("--resync-seconds") + 1] == "300"
    role = find(docs, "Role", "-operator-lease")
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert named == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "patch"],
            "resourceNames": [lease],
        }
    ]
    assert find(docs, "PodDisruptionBudget", "-operator")["spec"]["minAvailable"] == 1


def test_operator_args_are_what_prfaas_operator_parses(helm: str) -> None:
    """The chart's operator arguments through the CLI's own parser: the values arrive in OperatorConfig."""
    from prfaas_cli.main import build_parser
    from prfaas_cli.operator_cmd import config_from_args

    sets = [
        "operator.resyncSeconds=120",
        "operator.gatewayPeriodSeconds=7",
        "operator.linkPeriodSeconds=9",
        "operator.livenessStallSeconds=90",
    ]
    docs = render(helm, CHART, None, *[a for s in sets for a in ("--set", s)])
    container = containers(find(docs, "Deployment", "-operator"))[0]
    args = [a.replace("$(POD_NAME)", "prfaas-operator-0") for a in container["args"]]
    config = config_from_args(build_parser().parse_args(args))
    assert (config.resync_s, config.gateway_period_s, config.link_period_s) == (120, 7, 9)
    assert config.liveness_stall_s == 90 and config.log_level == "INFO"
    # the probes ask the operator's own health endpoints (test_operator_liveness: what they answer), not /metrics
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    port = next(p for p in container["ports"] if p["name"] == container["livenessProbe"]["httpGet"]["port"])
    assert port["containerPort"] == config.metrics_port
    assert config.namespaces == (NAMESPACE,) and config.identity == "prfaas-operator-0"
    assert config_from_args(build_parser().parse_args(["operator", "-n", "x"])).resync_s > 0  # flag optional


def test_dashboard_and_rules_ship_in_the_chart(helm: str) -> None:
    docs = render(helm, CHART, REPO / "examples/03-helm/region-b/values.yaml")
    dashboard = find(docs, "ConfigMap", "-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["prfaas.json"]) == json.loads((REPO / "dashboards/prfaas.json").read_text())
    rule = find(docs, "PrometheusRule", "prfaas")
    assert rule["spec"] == yaml.safe_load((REPO / "alerts/prfaas-rules.yaml").read_text())
    pods = [d for d in docs if d["kind"] == "PodMonitor"]
    relabel = {r["targetLabel"] for p in pods for e in p["spec"]["podMetricsEndpoints"] for r in e["relabelings"]}
    assert {"pd_cluster", "prefill_cluster", "role"} <= relabel


def test_notes_tell_the_user_what_to_do_next(helm: str) -> None:
    for values, needles in (
        ("examples/03-helm/region-b/values.yaml", ["get configmap pd-h20-router-config", "prfaas.routerSidecar"]),
        ("examples/03-helm/region-a/values.yaml", ["get svc prfaas-gateway", "get secret prefill-gateway-token"]),
    ):
        proc = run_helm(
            helm, "install", "prfaas", str(CHART), "-n", NAMESPACE, "--dry-run=client", "-f", str(REPO / values)
        )
        assert proc.returncode == 0, proc.stderr
        notes = proc.stdout.split("NOTES:", 1)[1]
        assert "helm install prfaas-crds" in notes
        for needle in needles:
            assert needle in notes, (values, needle)


# --- one image --------------------------------------------------------------------------------------------------


def dockerfile_entrypoints() -> list[str]:
    text = (REPO / "Dockerfile").read_text()
    m = re.search(r'io\.prfaas\.entrypoints="([^"]+)"', text)
    assert m, "the Dockerfile labels its entrypoints"
    assert 'ENTRYPOINT ["/opt/prfaas/bin/prfaas"]' in text  # the image itself: tests/integration/test_image.py
    return m.group(1).split()


def test_every_container_runs_a_subcommand_of_the_one_image(helm: str) -> None:
    from prfaas_cli.main import build_parser

    entrypoints = dockerfile_entrypoints()
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(entrypoints) <= set(sub.choices)  # type: ignore[arg-type]
    seen = set()
    for values in VALUES:
        for doc in render(helm, CHART, values):
            if doc["kind"] != "Deployment":
                continue
            for c in containers(doc):
                assert c["image"].startswith(("ghcr.io/prfaas/prfaas", "registry.example.com/prfaas/prfaas")), c
                assert c["args"][0] in entrypoints, c["args"]
                seen.add(c["args"][0])
    assert seen == set(entrypoints)


# --- RBAC against a real operator run ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def operator_calls(tmp_path_factory: pytest.TempPathFactory) -> tuple[set[Call], str]:
    """Every Kubernetes API call a real operator process made (the emulator's request log, the operator's
    bearer token only) while it assigned roles, flipped one instance after a drain, synced a Remote and a
    Managed PrefillCluster, published the router and gateway configs and cleaned up a deleted PDCluster."""
    return record_operator_calls(Path(tmp_path_factory.mktemp("rbac")))


def test_rbac_allows_every_call_of_the_operator_and_explains_every_other_rule(
    helm: str, operator_calls: tuple[set[Call], str]
) -> None:
    calls, ns = operator_calls
    sets = [f"operator.watchNamespaces={{{ns}}}", f"operator.lease.name=prfaas-operator-{ns}",
            "operator.rbac.secretNames={region-a-gateway-token}"]  # fmt: skip
    docs = render(helm, CHART, None, *[a for s in sets for a in ("--set", s)], "-n", ns)
    grants = grants_of(docs, "prfaas-operator")
    denied = sorted(str(c) for c in calls if not allowed(c, grants))
    assert not denied, f"calls the rendered RBAC would deny: {denied}"
    # every (resource, verb) the chart grants but the run did not call must be explained in the rules file
    used = {(group, resource, verb) for verb, group, resource, _, _ in calls}
    spec = load_rules(RULES_FILE)
    for section in ("namespaced", "lease", "cluster"):
        for rule in spec[section]:
            assert rule.get("why"), rule
            unexercised = rule.get("unexercised") or {}
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        key = f"{resource}/{verb}"
                        if (group, resource, verb) in used:
                            assert key not in unexercised, f"{key} is exercised now: drop it from `unexercised`"
                        else:
                            assert unexercised.get(key), f"{group}/{key} is granted, never called, and unexplained"
    # and nothing broader than the file: no wildcard, no verb the operator has no code for
    for _, rule in grants:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        assert set(rule["verbs"]) <= {"get", "list", "watch", "create", "patch", "delete"}


def test_the_readme_rbac_table_is_the_one_the_run_generates(operator_calls: tuple[set[Call], str]) -> None:
    """operator/README.md's table is regenerated from the request log (scripts/rbac_table.py), never edited."""
    calls, _ = operator_calls
    expected = rbac_table(calls, load_rules(RULES_FILE))
    assert readme_table(README.read_text()) == expected, (
        f"operator/README.md's RBAC table is not the run's: run `.venv/bin/python scripts/rbac_table.py`\n{expected}"
    )


def test_the_tokenizer_volume_is_mounted_into_routers_and_gateways(helm: str, tmp_path: Path) -> None:
    """values.tokenizer: the model's tokenizer reaches every router and gateway container at its mountPath
    (the ModelProfile's tokenizer.file points inside it), and nothing is mounted without a volume."""
    extra = tmp_path / "tokenizer.yaml"
    extra.write_text(
        "tokenizer:\n  mountPath: /models/tok\n  volume:\n    persistentVolumeClaim:\n      claimName: qwen-tokenizer\n"
    )
    for region, kind, kind_suffix in (("region-b", "Deployment", "-router"), ("region-a", "StatefulSet", "-gateway")):
        values = REPO / f"examples/03-helm/{region}/values.yaml"
        deploy = find(render(helm, CHART, values, "-f", str(extra)), kind, kind_suffix)
        pod = deploy["spec"]["template"]["spec"]
        volume = next(v for v in pod["volumes"] if v["name"] == "prfaas-tokenizer")
        assert volume["persistentVolumeClaim"] == {"claimName": "qwen-tokenizer"}
        mount = next(m for m in containers(deploy)[0]["volumeMounts"] if m["name"] == "prfaas-tokenizer")
        assert mount == {"name": "prfaas-tokenizer", "mountPath": "/models/tok", "readOnly": True}
        plain = find(render(helm, CHART, values), kind, kind_suffix)
        assert all(v["name"] != "prfaas-tokenizer" for v in plain["spec"]["template"]["spec"]["volumes"])
