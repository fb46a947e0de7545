"""The operator's credentials refresh (issue 46): a token file rotated on disk (as the kubelet rotates a projected
service-account token), an exec credential plugin (``aws eks get-token``-style) whose token changes, run again
after the API server refuses the old token (401) and before its ``expirationTimestamp``; and a running operator
(its own client and kopf's) that follows the rotation. Against the Kubernetes API emulator over HTTP, which sees
each request's bearer token and refuses all but the current one."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from prfaas_operator.kube import ApiError, KubeApi, KubeCredentials
from prfaas_operator.kubeconfig import REFRESH_EARLY_S
from prfaas_operator.runner import connection_info
from prfaas_testbed.k8s_emulator import EmulatorThread
from prfaas_testbed.prom import wait_until

PLUGIN = """
import json, pathlib, sys
here = pathlib.Path(sys.argv[1])
token = (here / "current").read_text().strip()
expires = (here / "expires").read_text().strip() if (here / "expires").exists() else ""
with open(here / "runs", "a") as runs:
    runs.write(token + "\\n")
status = {"token": token, **({"expirationTimestamp": expires} if expires else {})}
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": status}))
"""
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


def kubeconfig(tmp: Path, server: str, user: dict) -> Path:
    path = tmp / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "default"}}],
            }
        )
    )
    return path


def exec_user(tmp: Path, token: str) -> dict:
    (tmp / "plugin.py").write_text(PLUGIN)
    (tmp / "current").write_text(token)
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(tmp / "plugin.py"), str(tmp)],
        }
    }


def runs(tmp: Path) -> list[str]:
    return (tmp / "runs").read_text().split() if (tmp / "runs").exists() else []


def rotate(path: Path, token: str) -> None:
    """Replace the file in one step, as the kubelet swaps a projected volume's data."""
    staged = path.with_suffix(".new")
    staged.write_text(token)
    os.replace(staged, path)


def test_a_rotated_token_file_is_read_for_the_next_request(emu: EmulatorThread, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("sa-token-1\n")
    creds = KubeCredentials.load(str(kubeconfig(tmp_path, emu.url, {"tokenFile": "token"})))
    emu.k8s.accepted_tokens = {"sa-token-1"}

    async def scenario() -> None:
        api = KubeApi(creds, retries=0)
        try:
            await api.list(CONFIGMAPS)
            rotate(token, "sa-token-2\n")
            emu.k8s.accepted_tokens = {"sa-token-2"}  # the old token is no longer valid
            await api.list(CONFIGMAPS)
            assert api.reauthentications == 0  # read afresh: never sent the old token after the rotation
        finally:
            await api.aclose()

    asyncio.run(scenario())
    assert emu.k8s.bearers["sa-token-1"] == 1 and emu.k8s.bearers["sa-token-2"] == 1, emu.k8s.bearers


def test_an_exec_plugin_runs_again_after_a_401_and_before_its_expiry(emu: EmulatorThread, tmp_path: Path) -> None:
    creds = KubeCredentials.load(str(kubeconfig(tmp_path, emu.url, exec_user(tmp_path, "eks-1"))))
    assert runs(tmp_path) == ["eks-1"]  # run once at load
    emu.k8s.accepted_tokens = {"eks-1"}

    async def scenario() -> None:
        api = KubeApi(creds, retries=0)
        try:
            await api.list(CONFIGMAPS)
            await api.list(CONFIGMAPS)
            assert runs(tmp_path) == ["eks-1"]  # no expiry given: the token is kept while it works
            # the token expires on the server's side: a 401, the plugin runs again, the request is retried once
            (tmp_path / "current").write_text("eks-2")
            emu.k8s.accepted_tokens = {"eks-2"}
            await api.list(CONFIGMAPS)
            assert api.reauthentications == 1 and runs(tmp_path) == ["eks-1", "eks-2"]
            # a plugin that says when its token expires is run again before then, without a 401
            soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=30)  # inside the renewal margin
            (tmp_path / "expires").write_text(soon.isoformat().replace("+00:00", "Z"))
            (tmp_path / "current").write_text("eks-3")
            emu.k8s.accepted_tokens = {"eks-3", "eks-4"}
            creds.refused()  # pick up the expiry (as the next 401 would)
            await api.list(CONFIGMAPS)
            login = connection_info(creds)  # kopf logs in again a renewal margin before the token expires
            assert login.token == "eks-3" and login.expiration is not None
            assert abs((soon - login.expiration).total_seconds() - REFRESH_EARLY_S) < 1.5
            (tmp_path / "current").write_text("eks-4")
            await api.list(CONFIGMAPS)  # eks-3 is about to expire: eks-4 is fetched first
            assert api.reauthentications == 1, "renewed before expiry, not after a refusal"
            assert runs(tmp_path)[-2:] == ["eks-3", "eks-4"]
            # a token the server refuses even when fresh: one retry, then the 401 is the caller's
            emu.k8s.accepted_tokens = {"someone-else"}
            with pytest.raises(ApiError) as refused:
                await api.list(CONFIGMAPS)
            assert refused.value.status == 401
        finally:
            await api.aclose()

    asyncio.run(scenario())
    assert emu.k8s.bearers["eks-2"] >= 1 and emu.k8s.bearers["eks-4"] >= 1, emu.k8s.bearers


def test_a_running_operator_and_kopf_follow_a_rotated_exec_token(h, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The out-of-cluster operator on EKS: its exec plugin's token stops working mid-run. The operator's own
    client (Lease renewals) and kopf (its patches of a new object) both get 401, run the plugin again, and go on."""
    creds_dir = tmp_path / "creds"
    creds_dir.mkdir()
    h.kubeconfig = kubeconfig(creds_dir, h.emu.url, exec_user(creds_dir, "eks-a"))
    h.http.headers["Authorization"] = "Bearer test-client"
    h.prom.exporter.http.headers["Authorization"] = "Bearer test-client"
    h.emu.k8s.accepted_tokens = {"test-client", "eks-a"}
    ns = h.namespace()
    h.setup(ns)
    op = h.start_operator(ns)
    lease = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/prfaas-operator-{ns}"
    wait_until(lambda: (h.http.get(lease).json().get("spec") or {}).get("holderIdentity") == op.identity, 30, "lease")
    (creds_dir / "current").write_text("eks-b")
    h.emu.k8s.accepted_tokens = {"test-client", "eks-b"}
    refused_before = h.emu.k8s.bearers["eks-a"]
    renewed = (h.http.get(lease).json()["spec"]).get("renewTime")
    # the operator's own client: the Lease is renewed again, with the new token
    wait_until(lambda: h.http.get(lease).json()["spec"].get("renewTime") != renewed, 30, "a renewal after rotation")
    # kopf: a new object is handled (kopf patches its annotations) with the new token
    profile = json.loads(json.dumps(h.manifests(ns)[0]))
    profile["metadata"]["name"] = f"rotated-{ns}"
    h.create(profile)

    def handled() -> bool:
        annotations = (h.get("ModelProfile", None, f"rotated-{ns}") or {}).get("metadata", {}).get("annotations") or {}
        return any(k.startswith("kopf.prfaas.io") for k in annotations)

    wait_until(handled, 60, "kopf to handle an object created after the rotation")
    assert op.proc.poll() is None, op.logs()[-3000:]
    assert h.emu.k8s.bearers["eks-b"] > 0 and "eks-b" in runs(creds_dir)
    assert h.emu.k8s.bearers["eks-a"] > refused_before  # the old token was tried once more, and refused
    logs = op.logs()
    assert "Ran out of valid credentials" not in logs
    assert "Re-authentication has finished." in logs  # kopf was refused the old token and logged in again
