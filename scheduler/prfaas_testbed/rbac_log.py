"""The operator's Kubernetes API calls from a real run, and the RBAC table they generate.

:func:`record_operator_calls` runs ``prfaas operator`` (a real process) against the Kubernetes API emulator over
HTTP through a reconcile of the two-region example (role assignment, one flip after a drain, a Remote and a
Managed PrefillCluster, the router and gateway ConfigMaps, a PDCluster's deletion) and returns every call it
made, from the emulator's request log (the operator's bearer token only). :func:`rbac_table` turns those
calls and the chart's rules file (``helm/prfaas/files/operator-rbac.yaml``) into the README's table: per API
group and resource, the verbs the run called and the verbs granted that it did not (each with its reason in
the rules file). ``scripts/rbac_table.py`` writes the table into ``operator/README.md``;
``tests/integration/test_helm.py`` checks the README, the rules file and the rendered chart against one run.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import yaml

from prfaas_core.names import ANNOTATION_EGRESS_BANDWIDTH

from .operator_harness import REPO, Harness
from .prom import wait_until

RULES_FILE = REPO / "helm" / "prfaas" / "files" / "operator-rbac.yaml"
README = REPO / "operator" / "README.md"
BEGIN, END = "<!-- rbac-table:begin (scripts/rbac_table.py) -->", "<!-- rbac-table:end -->"

Call = tuple[str, str, str, str | None, str | None]
"""(verb, group, resource[/sub], namespace, name) of one API call."""
DISCOVERY = re.compile(r"^/(api|apis)(/[^/]+(/[^/]+)?)?/?$")
VERB_ORDER = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
SECRET_NAME = "region-a-gateway-token"
"""The Secret the run's Remote PrefillCluster names (the chart's ``operator.rbac.secretNames`` in the check)."""


def parse_call(method: str, path: str, watch: bool) -> Call | None:
    """(verb, group, resource[/sub], namespace, name) of an API call; None for discovery."""
    if DISCOVERY.match(path) and not path.startswith("/api/v1/namespaces"):
        return None
    if path.rstrip("/") == "/version":  # the start-up check; a non-resource URL every authenticated user may get
        return None
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        group, rest = parts[1], parts[3:]
    namespace = None
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource, name, sub = rest[0], rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None
    if name is None:
        verb = {"GET": "watch" if watch else "list", "POST": "create", "DELETE": "deletecollection"}[method]
    else:
        verb = {"GET": "get", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}[method]
    return verb, group, resource + (f"/{sub}" if sub else ""), namespace, name


def allowed(call: Call, grants: list[tuple[str | None, dict[str, Any]]]) -> bool:
    verb, group, resource, namespace, name = call
    for scope, rule in grants:
        if scope is not None and scope != namespace:
            continue
        if group not in rule["apiGroups"] or resource not in rule["resources"] or verb not in rule["verbs"]:
            continue
        names = rule.get("resourceNames")
        if names and (name is None or name not in names):
            continue
        return True
    return False


def grants_of(docs: list[dict[str, Any]], sa: str) -> list[tuple[str | None, dict[str, Any]]]:
    """Rules granted to the ServiceAccount: (None, rule) cluster-wide, (namespace, rule) by a RoleBinding."""
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs}
    out: list[tuple[str | None, dict[str, Any]]] = []
    for b in docs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == sa for s in b["subjects"]):
            continue
        ref = b["roleRef"]
        ns = b["metadata"].get("namespace") if b["kind"] == "RoleBinding" else None
        role = roles[(ref["kind"], ns if ref["kind"] == "Role" else None, ref["name"])]
        out += [(ns, rule) for rule in role["rules"]]
    return out


def paced(h: Harness, ns: str) -> bool:
    """Whether the operator wrote the egress-pacing annotation into the prefill Deployment's pod template."""
    body = h.get("Deployment", ns, "prefill-engines") or {}
    template = (body.get("spec") or {}).get("template") or {}
    return ANNOTATION_EGRESS_BANDWIDTH in ((template.get("metadata") or {}).get("annotations") or {})


def record_operator_calls(tmp: Path) -> tuple[set[Call], str]:
    """Every call a real operator process made through one reconcile of the example, and the namespace."""
    h = Harness(tmp)
    seen: set[tuple[str, str, bool]] = set()
    stop = threading.Event()

    def drain() -> None:
        for r in list(h.emu.k8s._requests):  # kmock's log (it trims old entries in long runs: poll often)
            if r.headers.get("Authorization") == "Bearer emulator-token":
                seen.add((str(r.method).rsplit(".", 1)[-1].upper(), r.url.path, bool(r.params.get("watch"))))

    def collect() -> None:
        while not stop.wait(0.05):
            drain()
        drain()  # the calls made since the last pass

    thread = threading.Thread(target=collect, daemon=True)
    thread.start()
    try:
        ns = h.namespace()
        op = h.start_operator(ns)
        meta = {"name": "prefill-engines", "namespace": ns}
        h.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "p"}}},
                  "status": {"readyReplicas": 1}})  # fmt: skip
        h.setup(ns)
        managed = next(d for d in h.manifests(ns) if d["kind"] == "PrefillCluster")
        managed["metadata"]["name"] = "local-prefill"
        pacing = {"link": "a-to-b", "capacityGbps": 100, "egressPacing": "PerInstance"}  # the pods' egress paced
        managed["spec"] = {**{k: v for k, v in managed["spec"].items() if k != "endpoint"}, "mode": "Managed",
                           "workload": {"kind": "Deployment", "name": "prefill-engines"},
                           "linkScheduling": pacing}  # fmt: skip
        h.create(managed)
        h.ready_roles(ns, 3, 5, 40)
        h.prom.exporter.set_queue(ns, "pd-h20", "prefill", 40)
        h.ready_roles(ns, 4, 4, 60)
        wait_until(lambda: h.condition(ns, "Ready", "local-prefill", "PrefillCluster").get("status"), 30, "managed")
        wait_until(lambda: h.get("ConfigMap", ns, "local-prefill-gateway-config"), 30, "the gateway config")
        wait_until(lambda: paced(h, ns), 30, "the prefill pods' egress paced")
        h.delete("PDCluster", ns, "pd-h20")
        wait_until(lambda: h.get("ConfigMap", ns, "pd-h20-router-config") is None, 30, "the finalizer's cleanup")
        op.stop()
    finally:
        stop.set()
        thread.join(10)
        h.close()
    calls = {c for c in (parse_call(m, p, w) for m, p, w in seen) if c is not None}
    return calls, ns


def load_rules(path: Path = RULES_FILE) -> dict[str, list[dict[str, Any]]]:
    rules: dict[str, list[dict[str, Any]]] = yaml.safe_load(path.read_text())
    return rules


def _group(g: str) -> str:
    return f"`{g}`" if g else '`""` (core)'


def _verbs(verbs: set[str]) -> str:
    return ", ".join(sorted(verbs, key=lambda v: (VERB_ORDER.index(v) if v in VERB_ORDER else 99, v))) or "—"


def rbac_table(calls: set[Call], rules: dict[str, list[dict[str, Any]]]) -> str:
    """The README's table: one row per (API group, resource) the chart grants or the run called."""
    scope_of = {"namespaced": "watched namespaces", "lease": "release namespace", "cluster": "cluster"}
    granted: dict[tuple[str, str], dict[str, Any]] = {}
    for section, section_rules in rules.items():
        for rule in section_rules:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    row = granted.setdefault((group, resource), {"verbs": set(), "scopes": [], "names": set()})
                    row["verbs"] |= set(rule["verbs"])
                    if scope_of[section] not in row["scopes"]:
                        row["scopes"].append(scope_of[section])
                    if rule.get("resourceNamesFrom"):
                        row["names"] |= set(rule["verbs"])
    called: dict[tuple[str, str], set[str]] = {}
    for verb, group, resource, _, _ in calls:
        called.setdefault((group, resource), set()).add(verb)
    lines = [
        "| API group | resource | scope | verbs the run called | granted, not called (reason in the rules file) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key in sorted(set(granted) | set(called), key=lambda k: (k[0] != "prfaas.io", k[0], k[1])):
        group, resource = key
        row = granted.get(key, {"verbs": set(), "scopes": ["not granted"], "names": set()})
        used = called.get(key, set())
        by_name = f"; {_verbs(row['names'])} by name only" if row["names"] else ""
        lines.append(
            f"| {_group(group)} | `{resource}` | {', '.join(row['scopes'])}{by_name} | {_verbs(used)} "
            f"| {_verbs(row['verbs'] - used)} |"
        )
    return "\n".join(lines) + "\n"


def with_table(readme: str, table: str) -> str:
    """``readme`` with the text between the table's markers replaced by ``table``."""
    start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    return readme[:start] + "\n" + table + readme[end:]


def readme_table(readme: str) -> str:
    start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    return readme[start:end].lstrip("\n")
