"""The operator under test as a real process, against the emulator and a real Prometheus.

``Harness`` bundles the emulator (HTTP), Prometheus + exporter, a fake remote prefill gateway (status
endpoint, token checked), a kubeconfig, and helpers to apply the two-region manifests into a fresh
namespace, start/stop operator processes, and read objects back. Every process is killed in teardown.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml

from prfaas_core.names import LABEL_PD_CLUSTER, METRIC_OPERATOR_CYCLE_SECONDS

from .k8s_emulator import EmulatorThread
from .prom import PrometheusStack, free_port, wait_until

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "01-two-region"
GROUP = "/apis/prfaas.io/v1alpha1"
PLURALS = {
    "PDCluster": "pdclusters",
    "PrefillCluster": "prefillclusters",
    "InterDCLink": "interdclinks",
    "ModelProfile": "modelprofiles",
}
GATEWAY_TOKEN = "s3cret-gateway-token"
CYCLE_COUNT = METRIC_OPERATOR_CYCLE_SECONDS + "_count"


class Gateway:
    """The remote prefill gateway's status endpoint (what region A's router serves), on 127.0.0.1."""

    def __init__(self) -> None:
        self.hits = 0
        self.auth: list[str] = []
        self.token = GATEWAY_TOKEN  # the bearer token it accepts (a test rotates it)
        gw = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                gw.hits += 1
                gw.auth.append(self.headers.get("Authorization", ""))
                if self.headers.get("Authorization") != f"Bearer {gw.token}":
                    self.send_response(401)
                    self.end_headers()
                    return
                body = json.dumps(
                    {
                        "prefillCluster": "prfaas-h200",
                        "readyInstances": 4,
                        "queueDepth": 0,
                        "egressGbps": 12.5,
                        "measuredPrefillTokensPerSecond": 90000.0,
                        "time": "2026-01-01T00:00:00Z",
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class OperatorProcess:
    def __init__(
        self,
        harness: Harness,
        namespace: str,
        identity: str,
        log: Path,
        extra: list[str],
        resync_s: float | None = None,
        command: list[str] | None = None,
    ) -> None:
        self.log_path = log
        self.identity = identity
        self.metrics_port = free_port()
        args = [
            *(command or [sys.executable, "-m", "prfaas_cli.main"]),
            "operator",
            "--namespace",
            namespace,
            "--prometheus-url",
            harness.prom.url,
            "--kubeconfig",
            str(harness.kubeconfig),
            "--metrics-port",
            str(self.metrics_port),
            "--lease-name",
            f"prfaas-operator-{namespace}",
            "--lease-duration-seconds",
            "4",
            "--lease-renew-seconds",
            "1",
            "--link-period-seconds",
            "1",
            "--gateway-period-seconds",
            "1",
            "--identity",
            identity,
            *extra,
        ]
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env["PYTHONUNBUFFERED"] = "1"  # tests read the log file while the operator runs
        env.pop("PRFAAS_RESYNC_SECONDS", None)
        if resync_s is not None:  # the periodic re-list (production default: 300 s)
            env["PRFAAS_RESYNC_SECONDS"] = str(resync_s)
        self._log = log.open("ab")
        # its own process group: a stop reaches what a wrapper (``buildah run``) started under it as well
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env, process_group=0)

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2).text

    def cycles(self) -> int:
        """The cycles the operator has run (its cycle-duration histogram's count; one per tick with work due)."""
        line = next((x for x in self.metrics().splitlines() if x.startswith(CYCLE_COUNT + " ")), None)
        return int(float(line.split()[-1])) if line else 0

    def wait_cycles(self, n: int, timeout_s: float = 60) -> None:
        """Until ``n`` more cycles have run: a test that checks that nothing happens lets cycles go by, not
        seconds (the deadline only bounds a hang)."""
        target = self.cycles() + n
        wait_until(lambda: self.cycles() >= target, timeout_s, f"{n} more operator cycles")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        with contextlib.suppress(ProcessLookupError):  # whatever is left of its group (the image's operator)
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")


class Harness:
    def __init__(self, tmp: Path, scrape_s: float = 1.0) -> None:
        self.tmp = tmp
        self.emu = EmulatorThread().start()
        self.kubeconfig = self.emu.write_kubeconfig(tmp / "kubeconfig")
        self.http = httpx.Client(base_url=self.emu.url, timeout=10)
        self.prom = PrometheusStack(self.emu.url, scrape_s).start()
        self.gateway = Gateway()
        self.operators: list[OperatorProcess] = []

    def close(self) -> None:
        for op in self.operators:
            op.stop(signal.SIGKILL)
        self.gateway.stop()
        self.prom.stop()
        self.http.close()
        self.emu.stop()

    # --- API helpers --------------------------------------------------------------------------------
    @staticmethod
    def path(kind: str, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
        core = {
            "Namespace": "namespaces",
            "Pod": "pods",
            "ConfigMap": "configmaps",
            "Secret": "secrets",
            "Event": "events",
            "Lease": "leases",
            "Deployment": "deployments",
        }
        if kind in PLURALS:
            base = GROUP
            plural = PLURALS[kind]
        elif kind == "Lease":
            base, plural = "/apis/coordination.k8s.io/v1", "leases"
        elif kind == "Deployment":
            base, plural = "/apis/apps/v1", "deployments"
        else:
            base, plural = "/api/v1", core[kind]
        out = base + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}"
        return out + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        ns = obj["metadata"].get("namespace") if obj["kind"] != "Namespace" else None
        resp = self.http.post(self.path(obj["kind"], ns), json=obj)
        resp.raise_for_status()
        return dict(resp.json())

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        resp = self.http.get(self.path(kind, namespace, name))
        return dict(resp.json()) if resp.status_code == 200 else None

    def list(self, kind: str, namespace: str | None) -> list[dict[str, Any]]:
        return list(self.http.get(self.path(kind, namespace)).json().get("items") or [])

    def patch(self, kind: str, namespace: str | None, name: str, body: dict[str, Any]) -> dict[str, Any]:
        resp = self.http.patch(
            self.path(kind, namespace, name), json=body, headers={"Content-Type": "application/merge-patch+json"}
        )
        resp.raise_for_status()
        return dict(resp.json())

    def delete(self, kind: str, namespace: str | None, name: str) -> None:
        self.http.delete(self.path(kind, namespace, name)).raise_for_status()

    def status(self, namespace: str, name: str = "pd-h20", kind: str = "PDCluster") -> dict[str, Any]:
        obj = self.get(kind, namespace, name)
        return dict((obj or {}).get("status") or {})

    def condition(self, namespace: str, type_: str, name: str = "pd-h20", kind: str = "PDCluster") -> dict[str, Any]:
        for c in self.status(namespace, name, kind).get("conditions") or []:
            if c.get("type") == type_:
                return dict(c)
        return {}

    def roles(self, namespace: str) -> dict[str, str]:
        return {
            p["metadata"]["name"]: (p["metadata"].get("labels") or {}).get("prfaas.io/role", "")
            for p in self.list("Pod", namespace)
        }

    def events(self, namespace: str) -> list[dict[str, Any]]:
        return self.list("Event", namespace)

    # --- scenario setup -----------------------------------------------------------------------------
    def namespace(self) -> str:
        ns = f"t-{uuid.uuid4().hex[:8]}"
        self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        self.prom.exporter.enabled_namespaces.add(ns)
        return ns

    def manifests(self, namespace: str, policy: dict[str, Any] | None = None, **pd_spec: Any) -> list[dict[str, Any]]:
        docs: list[dict[str, Any]] = []
        for f in (
            "common/model-profile.yaml",
            "region-b/inter-dc-link.yaml",
            "region-b/prefill-cluster-remote.yaml",
            "region-b/pd-cluster.yaml",
        ):
            docs += [d for d in yaml.safe_load_all((EXAMPLE / f).read_text()) if d]
        out = []
        for d in docs:
            if d["kind"] != "ModelProfile":
                d["metadata"]["namespace"] = namespace
            else:
                d["metadata"]["name"] = f"hybrid-1t-{namespace}"
            if "modelProfileRef" in d.get("spec", {}):
                d["spec"]["modelProfileRef"]["name"] = f"hybrid-1t-{namespace}"
            if d["kind"] == "PrefillCluster":
                d["spec"]["endpoint"] = {
                    "url": self.gateway.url,
                    "statusPath": "/status",
                    "tokenSecretRef": {"name": "region-a-gateway-token", "key": "token"},
                }
            if d["kind"] == "PDCluster":
                d["spec"]["workloads"] = {"shared": {"kind": "Deployment", "name": "pd-engines"}}
                d["spec"]["roleAssignment"] = {"mode": "Relabel", "initialPrefill": 3}
                d["spec"]["policy"] = {
                    "periodSeconds": 1,
                    "hysteresisCycles": 2,
                    "cooldownSeconds": 3600,
                    "drainTimeoutSeconds": 30,
                    "stepSize": 1,
                    **(policy or {}),
                }
                d["spec"].update(pd_spec)
            out.append(d)
        return out

    def setup(
        self,
        namespace: str,
        pods: int = 8,
        policy: dict[str, Any] | None = None,
        except_kinds: tuple[str, ...] = (),
        **pd_spec: Any,
    ) -> None:
        """The secret, the engine workload and its pods (no role yet), then the four PrFaaS objects (but
        ``except_kinds``)."""
        self.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "region-a-gateway-token", "namespace": namespace},
                "data": {"token": __import__("base64").b64encode(GATEWAY_TOKEN.encode()).decode()},
            }
        )
        self.create(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "pd-engines", "namespace": namespace},
                "spec": {"replicas": pods, "selector": {"matchLabels": {LABEL_PD_CLUSTER: "pd-h20"}}},
            }
        )
        for i in range(pods):
            self.create(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"pd-engines-{i}",
                        "namespace": namespace,
                        "labels": {LABEL_PD_CLUSTER: "pd-h20"},
                    },
                    "spec": {
                        "containers": [{"name": "engine", "ports": [{"name": "http", "containerPort": 8000 + i}]}]
                    },
                    "status": {
                        "phase": "Running",
                        "podIP": "127.0.0.1",
                        "conditions": [{"type": "Ready", "status": "True"}],
                    },
                }
            )
        for doc in self.manifests(namespace, policy, **pd_spec):
            if doc["kind"] not in except_kinds:
                self.create(doc)

    def start_operator(
        self,
        namespace: str,
        identity: str | None = None,
        extra: list[str] | None = None,
        wait_watches: bool = True,
        resync_s: float | None = None,
        watch_timeout_s: float = 60,
        command: list[str] | None = None,
    ) -> OperatorProcess:
        """Start an operator serving ``namespace`` and wait (up to ``watch_timeout_s``: its first list of a large
        fleet takes longer) until its watch streams are open. ``command``: how ``prfaas`` is run (default: this
        interpreter; from an image: test_image.py)."""
        before = sum(self.emu.k8s.watches.values())
        identity = identity or f"op-{uuid.uuid4().hex[:6]}"
        op = OperatorProcess(self, namespace, identity, self.tmp / f"{identity}.log", extra or [], resync_s, command)
        self.operators.append(op)
        if wait_watches:  # the four kinds and pods: five watch streams opened
            wait_until(
                lambda: (
                    (op.proc.poll() is None and sum(self.emu.k8s.watches.values()) - before >= 5)
                    or op.proc.poll() is not None
                ),
                watch_timeout_s,
                "the operator's watches",
            )
            assert op.proc.poll() is None, op.logs()[-3000:]
        return op

    def ready_roles(self, namespace: str, prefill: int, decode: int, timeout_s: float = 60) -> dict[str, str]:
        def ok() -> dict[str, str] | None:
            roles = self.roles(namespace)
            got = sorted(roles.values())
            return roles if got.count("prefill") == prefill and got.count("decode") == decode else None

        return dict(wait_until(ok, timeout_s, f"{prefill} prefill / {decode} decode"))


def harness(tmp: Path) -> Iterator[Harness]:
    h = Harness(tmp)
    try:
        yield h
    finally:
        h.close()
