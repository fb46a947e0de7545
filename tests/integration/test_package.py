"""The Python package: ``python -m build`` makes an sdist and a wheel that ``twine check --strict`` accepts, and
``pip install`` of the wheel into a clean venv (its dependencies from the locked wheels, offline) gives a working
``prfaas`` with the runtime dependencies only
(no plots, live view or test tools; a plot asked for names the extra to install)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(600)


def run(*argv: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    done = run(sys.executable, "-m", "build", "--outdir", str(out), str(REPO))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return out


def test_build_makes_an_sdist_and_a_wheel_twine_accepts(dist: Path) -> None:
    v = version("prfaas")
    (sdist,) = dist.glob(f"prfaas-{v}.tar.gz")
    (wheel,) = dist.glob(f"prfaas-{v}-py3-none-any.whl")
    done = run(sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel))
    assert done.returncode == 0, done.stdout + done.stderr
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = zf.read(f"prfaas-{v}.dist-info/METADATA").decode()
    assert f"prfaas-{v}.dist-info/licenses/LICENSE" in names
    assert "License-Expression: Apache-2.0" in meta
    for package in ("prfaas_cli", "prfaas_core", "prfaas_router", "prfaas_engine", "prfaas_link", "prfaas_operator"):
        assert f"{package}/__init__.py" in names, package
    assert "Provides-Extra: plots" in meta and "Provides-Extra: live" in meta


def test_pip_install_of_the_wheel_into_a_clean_venv_runs_prfaas_with_runtime_dependencies_only(
    dist: Path, tmp_path: Path
) -> None:
    (wheel,) = dist.glob("prfaas-*.whl")
    venv = tmp_path / "venv"
    assert run(sys.executable, "-m", "venv", str(venv)).returncode == 0
    py, prfaas = venv / "bin" / "python", venv / "bin" / "prfaas"
    # the dependencies from the locked wheels (scripts/wheelhouse.sh, downloaded once outside the clone): offline,
    # so this also proves the lock covers everything the wheel requires
    house = run(str(REPO / "scripts" / "wheelhouse.sh"), timeout_s=600)
    assert house.returncode == 0, house.stderr[-3000:]
    wheelhouse = house.stdout.strip().splitlines()[-1]
    done = run(str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index",
               "--no-compile", "--find-links", wheelhouse, str(wheel), timeout_s=500)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    done = run(str(prfaas), "--version")
    assert done.returncode == 0 and done.stdout.strip() == f"prfaas {version('prfaas')}", done.stderr
    probe = "import importlib.util as u, sys; print(' '.join(m for m in sys.argv[1:] if u.find_spec(m)))"
    present = run(str(py), "-c", probe, "matplotlib", "rich", "scipy", "numpy", "kubernetes", "pytest", "kopf")
    assert present.stdout.split() == ["kopf"], present.stdout
    assert run(str(prfaas), "plan", "--output", "json").returncode == 0
    plots = run(str(prfaas), "plan", "--plot-dir", str(tmp_path / "plots"))
    assert plots.returncode == 1 and "pip install 'prfaas[plots]'" in plots.stderr, plots.stderr
    assert not (tmp_path / "plots").exists()
    done = run(str(py), "-m", "pip", "check")
    assert done.returncode == 0, done.stdout
