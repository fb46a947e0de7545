"""The chart's security defaults, rendered by the real helm binary: no open gateway without an explicit
acknowledgement (and a warning in NOTES), and a ServiceMonitor that authenticates and verifies the gateway."""

from __future__ import annotations

import pytest
from test_helm import CHART, NAMESPACE, REPO, containers, find, helm, render, run_helm  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(300)
GATEWAY = ("gateway.enabled=true", "gateway.prefillCluster=p")


def _sets(*sets: str) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("gateway.tls.secretName=t",), "gateway.token.secretName is required"),
        (("gateway.tls.enabled=false", "gateway.token.secretName=k"), "gateway.service.type=LoadBalancer exposes"),
        (("gateway.tls.enabled=false", "gateway.token.secretName=k", "gateway.service.type=NodePort"), "NodePort"),
    ],
)
def test_an_open_gateway_does_not_render(helm: str, sets: tuple[str, ...], message: str) -> None:  # noqa: F811
    proc = run_helm(helm, "template", "prfaas", str(CHART), *_sets(*GATEWAY, *sets))
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert "security.allowInsecureGateway" in proc.stderr


def test_a_cluster_internal_plain_gateway_with_a_token_renders(helm: str) -> None:  # noqa: F811
    docs = render(
        helm,
        CHART,
        None,
        *_sets(*GATEWAY, "gateway.tls.enabled=false", "gateway.token.secretName=k", "gateway.service.type=ClusterIP"),
    )
    assert "--allow-insecure-gateway" not in containers(find(docs, "StatefulSet", "-gateway"))[0]["args"]


def test_the_acknowledged_insecure_gateway_passes_the_flag_and_notes_warn(helm: str) -> None:  # noqa: F811
    sets = _sets(*GATEWAY, "gateway.tls.enabled=false", "security.allowInsecureGateway=true")
    docs = render(helm, CHART, None, *sets)
    assert "--allow-insecure-gateway" in containers(find(docs, "StatefulSet", "-gateway"))[0]["args"]
    proc = run_helm(helm, "install", "prfaas", str(CHART), "-n", NAMESPACE, "--dry-run=client", *sets)
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "WARNING: security.allowInsecureGateway=true" in notes
    assert "NO bearer token" in notes and "plain HTTP" in notes
    safe = run_helm(
        helm, "install", "prfaas", str(CHART), "-n", NAMESPACE, "--dry-run=client",
        "-f", str(REPO / "examples/03-helm/region-a/values.yaml"),
    )  # fmt: skip
    # the example gateway has TLS and a token: no insecure-gateway warning (its engines' KV acknowledgement warns)
    assert "WARNING: security.allowInsecureGateway" not in safe.stdout.split("NOTES:", 1)[1]


def test_the_servicemonitor_sends_the_token_and_verifies_the_gateway_with_its_ca(helm: str) -> None:  # noqa: F811
    docs = render(helm, CHART, REPO / "examples/03-helm/region-a/values.yaml")
    sm = find(docs, "ServiceMonitor")
    https = next(e for e in sm["spec"]["endpoints"] if e["port"] == "https")
    assert https["scheme"] == "https"
    tls = https["tlsConfig"]
    assert tls.get("insecureSkipVerify") is False
    assert tls["ca"]["secret"] == {"name": "prefill-gateway-ca", "key": "ca.crt"}
    assert tls["serverName"] == "prefill-gateway.region-a.example.com"
    assert https["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "prefill-gateway-token", "key": "token"},
    }
    sets = _sets(
        *GATEWAY, "gateway.tls.secretName=t", "gateway.token.secretName=k", "monitoring.serviceMonitor.enabled=true"
    )
    default = find(render(helm, CHART, None, *sets), "ServiceMonitor")
    tls = next(e for e in default["spec"]["endpoints"] if e["port"] == "https")["tlsConfig"]
    assert tls["ca"]["secret"] == {"name": "t", "key": "ca.crt"}
    assert tls["serverName"] == f"prfaas-gateway.{NAMESPACE}.svc"


def _secret_rules(docs: list[dict[str, object]]) -> list[dict[str, object]]:
    return [
        r
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
        for r in d["rules"]  # type: ignore[attr-defined]
        if "secrets" in r["resources"]
    ]


def test_the_operator_reads_secrets_only_by_the_names_the_values_give(helm: str) -> None:  # noqa: F811
    assert _secret_rules(render(helm, CHART, REPO / "examples/03-helm/region-a/values.yaml")) == []
    assert _secret_rules(render(helm, CHART, None)) == []
    assert _secret_rules(render(helm, CHART, None, "--set", "operator.clusterWide=true")) == []
    (rule,) = _secret_rules(render(helm, CHART, REPO / "examples/03-helm/region-b/values.yaml"))
    assert rule["resourceNames"] == ["region-a-gateway-ca", "region-a-gateway-token"] and rule["verbs"] == ["get"]
    (rule,) = _secret_rules(render(helm, CHART, None, "--set", "router.secrets={tok}"))
    assert rule["resourceNames"] == ["tok"]
    (rule,) = _secret_rules(render(helm, CHART, None, "--set", "operator.rbac.allSecrets=true"))
    assert "resourceNames" not in rule
