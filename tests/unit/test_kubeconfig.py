"""The operator's own kubeconfig reader (prfaas_operator.kubeconfig, in place of the official client's loader):
the current context's server, CA, token or client certificate, from paths relative to the file or inline data,
an exec credential plugin run for real, and a clear error naming what is wrong."""

from __future__ import annotations

import base64
import json
import stat
import sys
from pathlib import Path

import pytest
import yaml

from prfaas_operator.kube import KubeCredentials
from prfaas_operator.kubeconfig import KubeconfigError, load


def write(tmp: Path, user: dict, cluster: dict | None = None, namespace: str | None = "team-a") -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "ctx",
        "contexts": [
            {"name": "other", "context": {"cluster": "nowhere", "user": "nobody"}},
            {
                "name": "ctx",
                "context": {"cluster": "c", "user": "u", **({"namespace": namespace} if namespace else {})},
            },
        ],
        "clusters": [{"name": "c", "cluster": cluster or {"server": "https://10.0.0.1:6443"}}],
        "users": [{"name": "u", "user": user}],
    }
    path = tmp / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_token_and_a_ca_path_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    cfg = write(tmp_path, {"token": "abc"}, {"server": "https://k:6443", "certificate-authority": "ca.crt"})
    creds = KubeCredentials.load(str(cfg))
    assert (creds.server, creds.bearer(), creds.default_namespace) == ("https://k:6443", "abc", "team-a")
    assert creds.ca_path == str(tmp_path / "ca.crt") and not creds.insecure


def test_inline_certificate_data_goes_to_private_files(tmp_path: Path) -> None:
    b64 = {k: base64.b64encode(f"-----{k}-----".encode()).decode() for k in ("ca", "crt", "key")}
    cfg = write(
        tmp_path,
        {"client-certificate-data": b64["crt"], "client-key-data": b64["key"]},
        {"server": "https://k", "certificate-authority-data": b64["ca"]},
    )
    got = load(str(cfg))
    assert got.token is None
    for path, text in (
        (got.ca_path, "-----ca-----"),
        (got.cert_path, "-----crt-----"),
        (got.key_path, "-----key-----"),
    ):
        assert path is not None and Path(path).read_text() == text
        assert stat.S_IMODE(Path(path).stat().st_mode) == 0o600
        Path(path).unlink()


def test_an_exec_plugin_is_run_and_its_token_used(tmp_path: Path) -> None:
    plugin = tmp_path / "get-token.py"
    plugin.write_text(
        "import json, os, sys\n"
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "print(json.dumps({'apiVersion': info['apiVersion'], 'kind': 'ExecCredential',\n"
        "                  'status': {'token': sys.argv[1] + '-' + os.environ['REGION']}}))\n"
    )
    exec_spec = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": sys.executable,
        "args": [str(plugin), "tok"],
        "env": [{"name": "REGION", "value": "eu"}],
    }
    assert load(str(write(tmp_path, {"exec": exec_spec}))).token == "tok-eu"
    failing = {**exec_spec, "args": ["-c", "import sys; sys.exit('no credentials')"]}
    with pytest.raises(KubeconfigError, match=r"exec: .* exited 1: no credentials"):
        load(str(write(tmp_path, {"exec": failing})))


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"current-context": ""}, "current-context is not set"),
        ({"current-context": "x", "contexts": []}, "contexts: no entry named 'x'"),
        (
            {"current-context": "x", "contexts": [{"name": "x", "context": {"cluster": "c"}}],
             "clusters": [{"name": "c", "cluster": {}}]},
            r"clusters\[c\].server is not set",
        ),
        (
            {"current-context": "x", "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
             "clusters": [{"name": "c", "cluster": {"server": "https://k"}}],
             "users": [{"name": "u", "user": {"username": "a", "password": "b"}}]},
            "basic auth is not supported",
        ),
    ],
)  # fmt: skip
def test_a_bad_kubeconfig_names_the_field(tmp_path: Path, doc: dict, message: str) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(doc))
    with pytest.raises(KubeconfigError, match=message):
        load(str(path))


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(KubeconfigError, match="cannot read it"):
        load(str(tmp_path / "absent"))
