"""``prfaas operator`` at start: an unreadable kubeconfig or an unreachable API server is one clear line and
a non-zero exit, not kopf's traceback and endless retry."""

from __future__ import annotations

import subprocess
from pathlib import Path

from testbed_support import PRFAAS, free_port


def _operator(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PRFAAS, "operator", "--metrics-port", "0", *args], capture_output=True, text=True, timeout=120
    )


def test_a_missing_kubeconfig_exits_with_one_line() -> None:
    done = _operator("--kubeconfig", "/nonexistent")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1
    assert len(lines) == 1 and lines[0].startswith("error: cannot load the kubeconfig (/nonexistent)"), done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def test_an_unreachable_api_server_exits_with_one_line(tmp_path: Path) -> None:
    server = f"https://127.0.0.1:{free_port()}"  # nothing listens there
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}', insecure-skip-tls-verify: true}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    done = _operator("--kubeconfig", str(kubeconfig))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1
    assert len(lines) == 1 and f"the API server {server} is unreachable" in lines[0], done.stderr
