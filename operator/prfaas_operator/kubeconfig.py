"""Where the operator's credentials come from: a kubeconfig file, or the in-cluster service account.

The operator needs only a server, a CA, and a bearer token or a client certificate, so this reads the kubeconfig
itself (PyYAML) rather than pulling in the official client (126 MB installed) for its loader. Covered: the
current context's cluster (``server``, ``certificate-authority[-data]``, ``insecure-skip-tls-verify``) and user
(``token``, ``tokenFile``, ``client-certificate[-data]``, ``client-key[-data]``, an ``exec`` credential plugin
such as ``aws eks get-token`` or ``gke-gcloud-auth-plugin``, and an ``auth-provider``'s stored
``id-token``/``access-token``), and the context's namespace.

Credentials that expire are refreshed, as kubectl does: an exec plugin is run again before its
``status.expirationTimestamp`` (EKS tokens live 15 minutes) and whenever the API server answers 401
(:meth:`ExecPlugin.invalidate`); a ``tokenFile`` (and the in-cluster projected service-account token, which
the kubelet rotates) is read afresh for every request. A certificate from an exec plugin is read once.

Relative paths are relative to the kubeconfig's folder, as kubectl reads them; inline ``*-data`` is written to
private temporary files, because TLS libraries load certificates from files. Anything else (basic auth) is
refused with the field named.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeconfigError(ValueError):
    """The kubeconfig cannot give credentials (names the field and why)."""


REFRESH_EARLY_S = 60.0
"""An exec plugin's token is renewed this long before its expirationTimestamp (a request in flight, clock skew)."""


class ExecPlugin:
    """An exec credential plugin and its last token: run again when the token is about to expire, or after the
    API server refused it (:meth:`invalidate`). Thread-safe (kopf's login handler runs in a worker thread)."""

    def __init__(self, spec: dict[str, Any], base: Path, clock: Callable[[], float] = time.time) -> None:
        self.spec, self.base, self.clock = spec, base, clock
        self.runs = 0
        self._lock = threading.Lock()
        self._status: dict[str, Any] | None = None
        self._expires: float | None = None

    def status(self) -> dict[str, Any]:
        """The ExecCredential's ``status``, from the last run while it is fresh, else from a new run."""
        with self._lock:
            if self._status is None or self.stale():
                self._status = _exec(self.spec, self.base)
                self._expires = _expiry(self._status.get("expirationTimestamp"))
                self.runs += 1
            return self._status

    def token(self) -> str | None:
        token = self.status().get("token")
        return str(token) if token else None

    def stale(self) -> bool:
        """Whether the next :meth:`status` runs the plugin (never run, refused, or about to expire)."""
        if self._status is None:
            return True
        return self._expires is not None and self.clock() >= self._expires - REFRESH_EARLY_S

    @property
    def expires(self) -> float | None:
        """When the current token expires (Unix seconds), if the plugin said."""
        return self._expires

    def invalidate(self) -> None:
        """The API server refused the token (401): the next :meth:`status` runs the plugin again."""
        with self._lock:
            self._status = None


def _expiry(value: Any) -> float | None:
    """``status.expirationTimestamp`` (RFC 3339) as Unix seconds; None when absent or unreadable (the token is
    then used until the API server refuses it)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()


@dataclass(frozen=True)
class Loaded:
    """What :func:`load` found (``KubeCredentials``' fields)."""

    server: str
    token: str | None = None
    token_file: str | None = None
    ca_path: str | None = None
    insecure: bool = False
    cert_path: str | None = None
    key_path: str | None = None
    default_namespace: str | None = None
    exec_plugin: ExecPlugin | None = field(default=None, compare=False, repr=False)
    """The exec credential plugin the token comes from, when it does (it refreshes the token)."""


def load(kubeconfig: str | None = None) -> Loaded:
    """From ``kubeconfig`` (or the first file in $KUBECONFIG, or ~/.kube/config), else the service account."""
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
    default_path = Path.home() / ".kube" / "config"
    if path is None and default_path.exists():
        path = str(default_path)
    if path is None and (SERVICE_ACCOUNT / "token").exists():
        return in_cluster()
    if path is None:
        raise KubeconfigError("no kubeconfig given or found, and not running in a cluster")
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise KubeconfigError(f"cannot read it: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise KubeconfigError(f"not YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise KubeconfigError("not a kubeconfig (a YAML mapping with clusters, users, contexts)")
    return from_config(doc, Path(path).resolve().parent)


def in_cluster() -> Loaded:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise KubeconfigError("in a pod but KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are not set")
    ns_file = SERVICE_ACCOUNT / "namespace"
    return Loaded(
        server=f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}",
        token_file=str(SERVICE_ACCOUNT / "token"),
        ca_path=str(SERVICE_ACCOUNT / "ca.crt"),
        default_namespace=ns_file.read_text().strip() if ns_file.exists() else None,
    )


def from_config(doc: dict[str, Any], base: Path) -> Loaded:
    """The current context's credentials; ``base`` resolves relative file paths."""
    name = doc.get("current-context")
    if not name:
        raise KubeconfigError("current-context is not set")
    context = _named(doc, "contexts", name, "context")
    cluster = _named(doc, "clusters", context.get("cluster"), "cluster")
    user = _named(doc, "users", context.get("user"), "user") if context.get("user") else {}
    server = cluster.get("server")
    if not server:
        raise KubeconfigError(f"clusters[{context.get('cluster')}].server is not set")
    token, token_file = user.get("token"), user.get("tokenFile")
    cert = _file(user, "client-certificate", base)
    key = _file(user, "client-key", base)
    if "username" in user or "password" in user:
        raise KubeconfigError("users[].user.username/password: basic auth is not supported; use a token")
    plugin = None
    if "exec" in user:
        plugin = ExecPlugin(user["exec"], base)
        status = plugin.status()  # run once now: a plugin that cannot run is a start-up error
        token = status.get("token") or token
        if not status.get("token"):
            plugin = None  # a client certificate only: read once
        if status.get("clientCertificateData"):
            cert = _temp(status["clientCertificateData"].encode(), "client.crt")
            key = _temp(str(status.get("clientKeyData", "")).encode(), "client.key")
    if "auth-provider" in user:
        cfg = (user["auth-provider"] or {}).get("config") or {}
        token = cfg.get("id-token") or cfg.get("access-token") or token
        if not token:
            raise KubeconfigError("users[].user.auth-provider has no stored id-token or access-token")
    return Loaded(
        server=str(server),
        token=token,
        token_file=str(base / token_file) if token_file else None,
        ca_path=_file(cluster, "certificate-authority", base),
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
        cert_path=cert,
        key_path=key,
        default_namespace=context.get("namespace"),
        exec_plugin=plugin,
    )


def _named(doc: dict[str, Any], section: str, name: Any, field: str) -> dict[str, Any]:
    for entry in doc.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(field)
            return value if isinstance(value, dict) else {}
    raise KubeconfigError(f"{section}: no entry named {name!r}")


def _file(section: dict[str, Any], field: str, base: Path) -> str | None:
    """``field`` as a path (relative to the kubeconfig), or ``field-data`` (base64) written to a private file."""
    if section.get(f"{field}-data"):
        try:
            data = base64.b64decode(section[f"{field}-data"], validate=True)
        except ValueError:
            raise KubeconfigError(f"{field}-data is not base64") from None
        return _temp(data, field)
    if section.get(field):
        return str(base / str(section[field]))
    return None


def _temp(data: bytes, name: str) -> str:
    fd, path = tempfile.mkstemp(prefix=f"prfaas-{name}-")  # mode 0600
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _exec(spec: dict[str, Any], base: Path) -> dict[str, Any]:
    """Run an exec credential plugin; its ExecCredential's ``status``."""
    command = spec.get("command")
    if not command:
        raise KubeconfigError("users[].user.exec.command is not set")
    if "/" in command and not os.path.isabs(command):
        command = str(base / command)
    env = dict(os.environ)
    env.update({e["name"]: e["value"] for e in spec.get("env") or [] if isinstance(e, dict) and "name" in e})
    env["KUBERNETES_EXEC_INFO"] = json.dumps(
        {"apiVersion": spec.get("apiVersion", ""), "kind": "ExecCredential", "spec": {"interactive": False}}
    )
    try:
        done = subprocess.run(
            [command, *(spec.get("args") or [])], env=env, capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KubeconfigError(f"users[].user.exec: cannot run {command}: {exc}") from None
    if done.returncode != 0:
        detail = " ".join(done.stderr.split())[:300]
        raise KubeconfigError(f"users[].user.exec: {command} exited {done.returncode}: {detail}")
    try:
        status = json.loads(done.stdout).get("status") or {}
    except (ValueError, AttributeError):
        raise KubeconfigError(f"users[].user.exec: {command} did not print an ExecCredential (JSON)") from None
    if not isinstance(status, dict) or not (status.get("token") or status.get("clientCertificateData")):
        raise KubeconfigError(f"users[].user.exec: {command}'s ExecCredential has no status.token or certificate")
    return status
