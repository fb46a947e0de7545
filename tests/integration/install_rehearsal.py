"""The machinery of the install rehearsal (test_install_rehearsal.py): two regions, each its own Kubernetes API
emulator, one kubeconfig with the contexts ``region-a`` and ``region-b`` (as docs/install.md addresses them), the
guide's fenced commands run in order by bash with the real helm and kubectl, and -- where the emulator cannot serve a
command -- the declared equivalent of :data:`EQUIVALENTS` instead. What the clusters' own controllers would do (the
workload controllers and kubelet making pods, the chart's operator Deployment running the operator) is done by
:class:`Rehearsal` after each chart install, and said so in :data:`CLUSTER_DOES`."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import kmock
import yaml

from prfaas_testbed.k8s_emulator import VERBS, EmulatorThread
from prfaas_testbed.prom import free_port, wait_until

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / ".cache" / "tools" / "bin"  # scripts/helm-tools.sh: the real helm and kubectl
CONTEXTS = ("region-a", "region-b")
EXTRA_KINDS = (
    # (group/version, plural, kind, namespaced): what the charts render beyond the emulator's own kinds
    ("apiextensions.k8s.io/v1", "customresourcedefinitions", "CustomResourceDefinition", False),
    ("v1", "services", "Service", True),  # kubectl's short name svc: below
    ("v1", "serviceaccounts", "ServiceAccount", True),
    ("rbac.authorization.k8s.io/v1", "clusterroles", "ClusterRole", False),
    ("rbac.authorization.k8s.io/v1", "clusterrolebindings", "ClusterRoleBinding", False),
    ("rbac.authorization.k8s.io/v1", "roles", "Role", True),
    ("rbac.authorization.k8s.io/v1", "rolebindings", "RoleBinding", True),
    ("networking.k8s.io/v1", "networkpolicies", "NetworkPolicy", True),
    ("policy/v1", "poddisruptionbudgets", "PodDisruptionBudget", True),
    ("monitoring.coreos.com/v1", "podmonitors", "PodMonitor", True),
    ("monitoring.coreos.com/v1", "servicemonitors", "ServiceMonitor", True),
    ("monitoring.coreos.com/v1", "prometheusrules", "PrometheusRule", True),
    ("leaderworkerset.x-k8s.io/v1", "leaderworkersets", "LeaderWorkerSet", True),
)
OWNER = "rehearsal.prfaas.io/owner"
"""The workload a pod of :meth:`Rehearsal.controllers` belongs to (the emulator keeps no ownerReferences' meaning)."""
CLUSTER_DOES = (
    "after every command: the LeaderWorkerSet and StatefulSet controllers and the kubelet make the engine pods "
    "(Running, Ready, a pod IP) from each vLLM workload's pod template",
    "the chart's operator Deployment runs `prfaas operator` with the rendered args, against that region's emulator "
    "(Prometheus: none here, so the operator reports Degraded PrometheusUnavailable and holds its decisions)",
)


@dataclass(frozen=True)
class Equivalent:
    """A guide line the emulator cannot serve (``pattern``), what runs instead, and why."""

    pattern: str
    instead: str
    """A bash template over the pattern's groups, or ``@name``: a step of :class:`Rehearsal` (``step_<name>``)."""
    why: str


EQUIVALENTS = (
    Equivalent(
        r"^kubectl --context (?P<ctx>\S+)(?P<ns>(?: -n \S+)?) create (?P<rest>.+)$",
        "kubectl --context {ctx}{ns} create {rest} --dry-run=client -o yaml | kubectl --context {ctx} apply "
        "--validate=false -f -",
        "kubectl create sends built-in kinds as protobuf; the emulator reads JSON (the object is the same)",
    ),
    Equivalent(
        r"^helm --kube-context (?P<ctx>\S+) (?:install|upgrade) (?P<release>\S+) (?P<chart>\S+)(?P<rest>.*)$",
        "@chart",
        "helm 4 installs by server-side apply and keeps its release in the API server; the emulator has neither: "
        "`helm template ... | kubectl apply --validate=false -n NS -f -`",
    ),
    Equivalent(
        r"^(?P<cmd>kubectl --context \S+ apply .+)$",
        "{cmd} --validate=false",
        "the emulator serves no OpenAPI document for kubectl's client-side validation",
    ),
    Equivalent(
        r"^kubectl --context (?P<ctx>\S+) -n (?P<ns>\S+) wait --for=condition=(?P<cond>\w+) (?P<objs>.+?) "
        r"--timeout=(?P<timeout>\d+)m$",
        "@wait",
        "the emulator's watch stream has a content type kubectl cannot decode: the condition is polled instead",
    ),
    Equivalent(
        r"^kubectl --context (?P<ctx>\S+) -n (?P<ns>\S+) port-forward svc/(?P<svc>\S+) (?P<local>\d+):\d+ &$",
        "@router",
        "no kubelet, no pod to forward to: the router runs here on the operator's ConfigMap with the Secrets "
        "mounted where that config names them, as the router pod does, on a free port",
    ),
    Equivalent(
        r"^curl -s localhost:(?P<local>\d+)(?P<path>/\S*)$",
        "curl -s -m 10 http://127.0.0.1:{router_port}{path}",
        "the router of the port-forward's equivalent listens on a free port (another run may hold 8000)",
    ),
)


def guide_commands(markdown: str) -> list[str]:
    """The commands of the guide's ```bash blocks, in order (continuation lines joined, comments dropped)."""
    out = []
    for block in re.findall(r"^ *```bash\n(.*?)^ *```", markdown, flags=re.S | re.M):
        text = re.sub(r"\\\n\s*", " ", block)
        for line in text.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def equivalent_of(line: str) -> tuple[Equivalent, dict[str, str]] | None:
    for eq in EQUIVALENTS:
        m = re.match(eq.pattern, line)
        if m:
            return eq, {k: v or "" for k, v in m.groupdict().items()}
    return None


class Region:
    """One region's API server (the emulator) and the processes a cluster would run there."""

    def __init__(self, name: str, tmp: Path) -> None:
        self.name = name
        self.emu = EmulatorThread().start()
        for gv, plural, kind, namespaced in EXTRA_KINDS:
            self.emu.k8s.resources[f"{gv}/{plural}"] = kmock.ResourceInfo(
                kind=kind,
                namespaced=namespaced,
                verbs=VERBS,
                subresources={"status"},
                shortnames={"svc"} if kind == "Service" else set(),
            )
        self.kubeconfig = self.emu.write_kubeconfig(tmp / f"kubeconfig-{name}")
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.http = httpx.Client(base_url=self.emu.url, timeout=10)

    def get(self, path: str) -> dict[str, Any] | None:
        r = self.http.get(path)
        return None if r.status_code == 404 else dict(r.raise_for_status().json())

    def items(self, path: str) -> list[dict[str, Any]]:
        return list((self.get(path) or {}).get("items") or [])

    def condition(self, path: str, type_: str) -> dict[str, Any] | None:
        obj = self.get(path) or {}
        return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
        self.http.close()
        self.emu.stop()


def plural_of(kind: str) -> str:
    return {"PDCluster": "pdclusters", "InterDCLink": "interdclinks", "PrefillCluster": "prefillclusters"}.get(
        kind, kind.lower() + "s"
    )


def object_path(kind: str, namespace: str, name: str) -> str:
    gv = "leaderworkerset.x-k8s.io/v1" if kind == "LeaderWorkerSet" else "prfaas.io/v1alpha1"
    core = {"Pod": "/api/v1", "ConfigMap": "/api/v1", "Secret": "/api/v1", "StatefulSet": "/apis/apps/v1"}
    base = core.get(kind, f"/apis/{gv}")
    return f"{base}/namespaces/{namespace}/{plural_of(kind)}/{name}"


class Rehearsal:
    """Runs a guide's commands in ``work`` (the repository's ``helm`` and ``examples`` linked in, and the material an
    operator brings: the gateway's certificate, key and CA) against the two regions."""

    def __init__(self, tmp: Path, repo: Path = REPO) -> None:
        self.tmp = tmp
        self.work = tmp / "work"
        self.work.mkdir(exist_ok=True)
        self.repo = repo
        for name in ("helm", "examples"):
            link = self.work / name
            if link.is_symlink():
                link.unlink()
            link.symlink_to(repo / name)
        self.regions = {c: Region(c, tmp) for c in CONTEXTS}
        self.kubeconfig = tmp / "kubeconfig"
        self._write_kubeconfig()
        self.router_port = 0
        self.ran: list[tuple[str, str]] = []  # (the guide's line, what ran)
        self.outputs: list[str] = []
        self.seconds: list[tuple[str, float]] = []
        if not (self.work / "gateway.crt").exists():
            self._certificate()

    def use_repo(self, repo: Path) -> None:
        """The charts and examples of another checkout (the upgrade's previous release)."""
        self.repo = repo
        for name in ("helm", "examples"):
            (self.work / name).unlink()
            (self.work / name).symlink_to(repo / name)

    def _write_kubeconfig(self) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": CONTEXTS[0],
            "clusters": [{"name": c, "cluster": {"server": r.emu.url}} for c, r in self.regions.items()],
            "users": [{"name": "emu", "user": {"token": "emulator-token"}}],
            "contexts": [{"name": c, "context": {"cluster": c, "user": "emu"}} for c in CONTEXTS],
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))

    def _certificate(self) -> None:
        names = "DNS:prefill-gateway.region-a.example.com,DNS:*.prfaas-gateway-peers.prfaas.svc"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
             "/CN=prefill-gateway.region-a.example.com", "-addext", f"subjectAltName={names}",
             "-keyout", "gateway.key", "-out", "gateway.crt"],
            cwd=self.work, check=True, capture_output=True,
        )  # fmt: skip
        (self.work / "gateway-ca.crt").write_bytes((self.work / "gateway.crt").read_bytes())

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env["PATH"] = f"{TOOLS}:{Path(sys.executable).parent}:{env.get('PATH', '')}"
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["HOME"] = str(self.tmp)  # kubectl's discovery cache, helm's config: not the user's
        return env

    def bash(self, command: str, timeout_s: float = 120) -> str:
        started = time.monotonic()
        proc = subprocess.run(
            ["bash", "-o", "pipefail", "-c", command],
            cwd=self.work, env=self.env, capture_output=True, text=True, timeout=timeout_s,
        )  # fmt: skip
        assert proc.returncode == 0, f"{command}\n{proc.stdout}\n{proc.stderr}"
        self.seconds.append((command, time.monotonic() - started))
        return proc.stdout

    def run_guide(self, markdown: str) -> None:
        for line in guide_commands(markdown):
            started = time.monotonic()
            self._line(line)
            self.seconds.append((f"[line] {line}", time.monotonic() - started))

    def _line(self, line: str) -> None:
        found = equivalent_of(line)
        if found is None:
            self.ran.append((line, line))
            self.outputs.append(self.bash(line))
        else:
            eq, groups = found
            if eq.instead.startswith("@"):
                self.ran.append((line, eq.instead))
                step: Callable[[dict[str, str]], None] = getattr(self, f"step_{eq.instead[1:]}")
                step(groups)
            else:
                command = eq.instead.format(**groups, router_port=self.router_port)
                self.ran.append((line, command))
                self.outputs.append(self.bash(command))
        self.controllers()

    # --- the steps the emulator cannot serve as written -------------------------------------------------------

    def step_chart(self, g: dict[str, str]) -> None:
        ns_match = re.search(r"(?:-n|--namespace) (\S+)", g["rest"])
        ns = f" -n {ns_match.group(1)}" if ns_match else ""
        rendered = self.bash(f"helm template {g['release']} {g['chart']}{g['rest']}")
        (self.tmp / f"{g['ctx']}-{g['release']}.yaml").write_text(rendered)
        self.bash(
            f"helm template {g['release']} {g['chart']}{g['rest']} | kubectl --context {g['ctx']} apply "
            f"--validate=false{ns} -f -"
        )
        if ns_match:  # the application chart: its operator Deployment runs (CLUSTER_DOES)
            self.start_operator(g["ctx"], [d for d in yaml.safe_load_all(rendered) if d])

    def controllers(self) -> None:
        """What each region's workload controllers, garbage collector and kubelet do for every vLLM LeaderWorkerSet
        or StatefulSet (one-pod groups): a Running, Ready pod with a pod IP per replica from its pod template, owned
        by it (a name another workload's pod holds is not taken: AlreadyExists); a pod whose template changed is
        replaced (a rollout); the pods of a deleted workload are deleted."""
        for n, region in enumerate(self.regions.values()):
            workloads = region.items("/apis/leaderworkerset.x-k8s.io/v1/leaderworkersets") + region.items(
                "/apis/apps/v1/statefulsets"
            )
            owners = {f"{w['kind']}/{w['metadata']['namespace']}/{w['metadata']['name']}" for w in workloads}
            for pod in region.items("/api/v1/pods"):
                owner = (pod["metadata"].get("annotations") or {}).get(OWNER)
                if owner is not None and owner not in owners:
                    region.http.delete(object_path("Pod", pod["metadata"]["namespace"], pod["metadata"]["name"]))
            for j, d in enumerate(workloads):
                spec = d["spec"]
                template = (
                    spec["leaderWorkerTemplate"]["workerTemplate"]
                    if d["kind"] == "LeaderWorkerSet"
                    else spec["template"]
                )
                if not any("vllm" in str(c.get("image", "")) for c in template["spec"]["containers"]):
                    continue  # not an engine (the gateway's StatefulSet)
                ns, owner = (
                    d["metadata"]["namespace"],
                    f"{d['kind']}/{d['metadata']['namespace']}/{d['metadata']['name']}",
                )
                for i in range(int(spec.get("replicas", 1))):
                    name = f"{d['metadata']['name']}-{i}"
                    pod = region.get(object_path("Pod", ns, name))
                    if pod is not None:
                        if (pod["metadata"].get("annotations") or {}).get(OWNER) != owner or pod["spec"] == template[
                            "spec"
                        ]:
                            continue
                        region.http.delete(object_path("Pod", ns, name)).raise_for_status()
                    metadata = {"name": name, "namespace": ns, "labels": template["metadata"]["labels"],
                                "annotations": {OWNER: owner}}  # fmt: skip
                    pod = {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": metadata,
                        "spec": template["spec"],
                        "status": {"phase": "Running", "podIP": f"10.{n + 1}.{j}.{i + 1}",
                                   "conditions": [{"type": "Ready", "status": "True"}]},
                    }  # fmt: skip
                    region.http.post(f"/api/v1/namespaces/{ns}/pods", json=pod).raise_for_status()

    def start_operator(self, ctx: str, docs: list[dict[str, Any]]) -> None:
        region = self.regions[ctx]
        if any(p.poll() is None for p in region.procs):
            return  # a chart upgrade: the running operator stands for the rolled one
        deploy = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-operator"))
        args = list(deploy["spec"]["template"]["spec"]["containers"][0]["args"])
        override = {
            "--prometheus-url": f"http://127.0.0.1:{free_port()}",  # nothing listens: no Prometheus here
            "--metrics-port": "0",
            "--identity": f"rehearsal-{ctx}",
            "--lease-duration-seconds": "4",
            "--lease-renew-seconds": "1",
            "--link-period-seconds": "1",
            "--gateway-period-seconds": "1",
        }
        for i, a in enumerate(args[:-1]):
            if a in override:
                args[i + 1] = override[a]
        log = self.tmp / f"operator-{ctx}.log"
        region.logs.append(log)
        env = {**self.env, "PYTHONUNBUFFERED": "1"}
        env.pop("KUBECONFIG")
        before = sum(region.emu.k8s.watches.values())
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "prfaas_cli.main", *args, "--kubeconfig", str(region.kubeconfig)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        region.procs.append(proc)
        # the pod's readiness: its watches open (the four kinds and pods), as a Deployment's rollout waits for it
        wait_until(
            lambda: proc.poll() is not None or sum(region.emu.k8s.watches.values()) - before >= 5,
            60,
            f"{ctx}: the operator's watches",
        )
        assert proc.poll() is None, log.read_text()[-3000:]

    def step_wait(self, g: dict[str, str]) -> None:
        region = self.regions[g["ctx"]]
        for obj in g["objs"].split():
            kind_plural, name = obj.split("/")
            kind = {"pdcluster": "PDCluster", "interdclink": "InterDCLink", "prefillcluster": "PrefillCluster"}[
                kind_plural
            ]
            path = object_path(kind, g["ns"], name)
            wait_until(
                lambda path=path: (region.condition(path, g["cond"]) or {}).get("status") == "True",
                min(90.0, 60.0 * float(g["timeout"])),
                f"{g['ctx']}: {obj} {g['cond']}; operator log: {self.operator_log(g['ctx'])[-2000:]}",
            )

    def step_router(self, g: dict[str, str]) -> None:
        """The router pod: the operator's ConfigMap mounted at the config path, the Secrets at theirs."""
        region = self.regions[g["ctx"]]
        ns = g["ns"]
        configs = [c for c in region.items(f"/api/v1/namespaces/{ns}/configmaps") if c["metadata"]["name"].endswith(
            "-router-config")]  # fmt: skip
        assert len(configs) == 1, [c["metadata"]["name"] for c in configs]
        mnt = self.tmp / f"mnt-{g['ctx']}"
        for secret in region.items(f"/api/v1/namespaces/{ns}/secrets"):
            for key, value in (secret.get("data") or {}).items():
                path = mnt / "secrets" / secret["metadata"]["name"] / key
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(base64.b64decode(value))
        ((text,),) = [configs[0]["data"].values()]
        config = mnt / "router-config.json"
        config.write_text(text.replace("/var/run/prfaas/", f"{mnt}/"))
        self.router_port = free_port()
        log = self.tmp / f"router-{g['ctx']}.log"
        region.logs.append(log)
        with log.open("ab") as out:
            region.procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "prfaas_cli.main",
                        "router",
                        "--config",
                        str(config),
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(self.router_port),
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                )
            )
        wait_until(
            lambda: httpx.get(f"http://127.0.0.1:{self.router_port}/health", timeout=2).status_code == 200,
            30,
            f"the router on the operator's config: {log.read_text()[-2000:] if log.exists() else ''}",
        )

    def operator_log(self, ctx: str) -> str:
        return "".join(p.read_text() for p in self.regions[ctx].logs if p.exists() and "operator" in p.name)

    def close(self) -> None:
        for region in reversed(self.regions.values()):  # kmock's resolver patches unwind last in, first out
            region.close()
