"""The image, built and run here: the root Dockerfile built with buildah (vfs storage, chroot isolation: no Docker
engine runs here) on a Debian base made by mmdebstrap (scripts/image-tools.sh; no registry can be reached, so the
official python base is not pulled here, a public CI builds on it). Then, from the image as its own user: the
version and every entrypoint the chart runs; what it does not carry (plots, the live view, the test tools,
scipy, the kubernetes client) and the clear error a missing extra gives; the router and the prefill gateway
answering completions in front of emulated engines (those run from this venv); and the operator reconciling a
PDCluster against the Kubernetes API emulator. Prints the image's size; removes the image and the containers it
made, by name. Skips, saying why, only where buildah cannot be installed (not root)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import pytest
from testbed_support import GATEWAY_AUTH, counter, http, processes, prompt, start_stack

from prfaas_testbed.operator_harness import Harness
from prfaas_testbed.prom import wait_until

REPO = Path(__file__).resolve().parents[2]
BUILDAH_ENV = {"STORAGE_DRIVER": "vfs", "BUILDAH_ISOLATION": "chroot"}
ENV_PREFIX = ["env", *(f"{k}={v}" for k, v in BUILDAH_ENV.items())]
PRFAAS_IN_IMAGE = "/opt/prfaas/bin/prfaas"
# what the base install must not carry (extras or nothing: matplotlib/plots, rich/live, the test tools)
NOT_IN_IMAGE = ("matplotlib", "rich", "numpy", "scipy", "kubernetes", "pytest", "kmock", "openai")

pytestmark = pytest.mark.timeout(900)


def buildah(*args: str, timeout_s: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["buildah", *args], capture_output=True, text=True, timeout=timeout_s, env={**os.environ, **BUILDAH_ENV}
    )
    if check:
        assert done.returncode == 0, f"buildah {' '.join(args)}: {done.stderr[-3000:]}"
    return done


@dataclass
class Image:
    name: str
    container: str
    shared: Path
    """A world-readable host folder, mounted read-only at the same path in every process run from the image."""

    def command(self) -> list[str]:
        """argv prefix that runs ``prfaas`` from the image, as the image's user, on the host's network."""
        return [*ENV_PREFIX, "buildah", "run", "-v", f"{self.shared}:{self.shared}:ro", self.container, "--",
                PRFAAS_IN_IMAGE]  # fmt: skip

    def run(self, *argv: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.command(), *argv], capture_output=True, text=True, timeout=timeout_s)


@pytest.fixture(scope="module")
def image() -> Iterator[Image]:
    setup = subprocess.run([str(REPO / "scripts" / "image-tools.sh")], capture_output=True, text=True, timeout=600)
    if setup.returncode == 3:
        pytest.skip(f"cannot build the image here: {setup.stderr.strip()}")
    assert setup.returncode == 0, setup.stderr[-3000:]
    base = setup.stdout.strip().splitlines()[-1]
    # the locked wheels, downloaded once outside the clone: the build installs from them (hashes checked), offline
    house = subprocess.run([str(REPO / "scripts" / "wheelhouse.sh")], capture_output=True, text=True, timeout=600)
    assert house.returncode == 0, house.stderr[-3000:]
    wheelhouse = house.stdout.strip().splitlines()[-1]
    tag = uuid.uuid4().hex[:8]
    name, container = f"localhost/prfaas-test-{tag}", f"prfaas-test-{tag}"
    shared = Path(tempfile.mkdtemp(prefix="prfaas-image-"))
    shared.chmod(0o755)  # the image's user (10001) reads the configs the tests write here
    started = time.monotonic()
    try:
        buildah("bud", "--quiet", "--build-arg", f"BASE_IMAGE={base}", "-v", f"{wheelhouse}:/wheelhouse:ro",
                "--build-arg", "PIP_NO_INDEX=1", "--build-arg", "PIP_FIND_LINKS=/wheelhouse",
                "-t", name, "-f", str(REPO / "Dockerfile"), str(REPO))  # fmt: skip
        built_s = time.monotonic() - started
        buildah("from", "--quiet", "--name", container, name)
        size = buildah("images", "--format", "{{.Size}}", name).stdout.strip()
        report = f"image {name} on {base}: built in {built_s:.0f} s, {size}"
        print(f"\n{report}", file=sys.__stderr__, flush=True)  # beside pytest's capture and xdist
        (REPO / "out").mkdir(exist_ok=True)
        (REPO / "out" / "image-size.txt").write_text(report + "\n")
        yield Image(name, container, shared)
    finally:
        buildah("rm", container, check=False)
        buildah("rmi", name, check=False)
        shutil.rmtree(shared, ignore_errors=True)


def shared_dir(image: Image, name: str) -> Path:
    path = image.shared / name
    path.mkdir(mode=0o755)
    path.chmod(0o755)
    return path


def test_the_image_runs_prfaas_as_its_own_user_with_every_entrypoint_the_chart_runs(image: Image) -> None:
    done = image.run("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"prfaas {version('prfaas')}"
    config = buildah("inspect", "--type", "image", "--format", "{{.Docker.Config.User}} {{.Docker.Config.Entrypoint}}",
                     image.name).stdout  # fmt: skip
    assert config.split()[0] == "10001:10001" and PRFAAS_IN_IMAGE in config, config
    who = subprocess.run([*ENV_PREFIX, "buildah", "run", image.container, "--", "id", "-u"], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert who.stdout.strip() == "10001", who.stderr
    label = re.search(r'io\.prfaas\.entrypoints="([^"]+)"', (REPO / "Dockerfile").read_text())
    assert label, "the Dockerfile labels its entrypoints (test_helm.py checks the chart runs only these)"
    for command in label.group(1).split():
        done = image.run(command, "--help")
        assert done.returncode == 0 and f"prfaas {command}" in done.stdout, (command, done.stderr[-2000:])


def test_the_image_carries_the_runtime_dependencies_only_and_names_the_extra_it_lacks(image: Image) -> None:
    probe = "import importlib.util as u, sys; print(' '.join(m for m in sys.argv[1:] if u.find_spec(m)))"
    done = subprocess.run(
        [*ENV_PREFIX, "buildah", "run", image.container, "--", "/opt/prfaas/bin/python", "-c", probe,
         *NOT_IN_IMAGE, "pip", "prfaas_core", "kopf", "aiohttp"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["prfaas_core", "kopf", "aiohttp"], f"in the image: {done.stdout}"
    plots = image.run("plan", "--plot-dir", "/tmp/plots")
    assert plots.returncode == 1, plots.stderr
    assert "pip install 'prfaas[plots]'" in plots.stderr and "Traceback" not in plots.stderr, plots.stderr
    assert image.run("plan", "--output", "json").returncode == 0  # the same command without plots works


def test_the_router_and_the_gateway_from_the_image_answer_completions(image: Image) -> None:
    tmp = shared_dir(image, "router")
    with processes(tmp) as procs:
        # the router and the prefill gateway from the image; the emulated engines and the link from this venv
        st = start_stack(procs, tmp, router_cmd=image.command())
        local_before = counter(st.router, "prfaas_router_requests_total", route="local", outcome="ok")
        remote_before = counter(st.router, "prfaas_router_requests_total", route="remote", outcome="ok")
        for tokens in (2_000, 40_000):  # a short prompt prefilled locally, a long one through the gateway
            status, body = http("POST", st.router + "/v1/completions",
                                {"model": "m", "prompt": prompt(tokens), "max_tokens": 4}, timeout_s=60)  # fmt: skip
            assert status == 200, body
            assert body["choices"][0]["text"] and body["usage"]["prompt_tokens"] == tokens, body
        assert counter(st.router, "prfaas_router_requests_total", route="local", outcome="ok") == local_before + 1
        assert counter(st.router, "prfaas_router_requests_total", route="remote", outcome="ok") == remote_before + 1
        status, body = http("GET", st.url("gateway") + "/status", headers=GATEWAY_AUTH, timeout_s=10)
        assert status == 200, body
        assert http("GET", st.url("gateway") + "/status", timeout_s=10)[0] == 401  # the gateway checks its token


def test_the_operator_from_the_image_reconciles_a_pdcluster(image: Image) -> None:
    h = Harness(shared_dir(image, "operator"))
    try:
        ns = h.namespace()
        op = h.start_operator(ns, command=image.command())  # reads the harness's kubeconfig from the shared folder
        h.setup(ns)
        h.ready_roles(ns, 3, 5, 90)
        cm = wait_until(lambda: h.get("ConfigMap", ns, "pd-h20-router-config"), 60, "the router config published")
        assert '"thresholdMinTokens"' in cm["data"]["router-config.json"]
        # the loop publishes the ConfigMap before it writes the status: wait for the status too
        wait_until(lambda: h.status(ns).get("thresholdMinTokens"), 60, "the status written with its bounds on t")
        assert op.cycles() >= 1
    finally:
        h.close()
