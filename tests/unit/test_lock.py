"""The lock the image installs from (requirements/runtime.txt, scripts/lock.sh): every runtime dependency of
pyproject.toml is in it at its pinned version, every entry carries hashes (pip --require-hashes), and it was made
from the dependencies pyproject.toml lists now (a changed pin without a new lock fails here, not in a build).
The image build (tests/integration/test_image.py) proves the rest: pip in hash mode refuses a lock that misses a
transitive dependency, and ``pip check`` runs on the result."""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
RUNTIME = REPO / "requirements" / "runtime.txt"
BUILD = REPO / "requirements" / "build.txt"
REFRESH = "run scripts/lock.sh"


def entries(path: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of a pip requirements file with hashes."""
    text = path.read_text().replace("\\\n", " ")
    out: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)(.*)$", line.strip())
        if m:
            out[canonicalize_name(m.group(1))] = (m.group(2), re.findall(r"--hash=sha256:([0-9a-f]{64})", m.group(3)))
    return out


def test_every_runtime_dependency_is_locked_at_its_pin_with_hashes() -> None:
    locked = entries(RUNTIME)
    assert len(locked) > 20, "the lock holds the whole closure, not only the direct dependencies"
    for spec in PYPROJECT["project"]["dependencies"]:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in locked, f"{req.name} is a runtime dependency but missing from {RUNTIME.name}: {REFRESH}"
        (pin,) = [s.version for s in req.specifier if s.operator == "=="]
        assert locked[name][0] == pin, f"{req.name}: pyproject pins {pin}, the lock has {locked[name][0]}: {REFRESH}"
    for name, (_, hashes) in locked.items():
        assert hashes, f"{name} has no --hash in {RUNTIME.name}: pip install --require-hashes would refuse it"


def test_the_lock_was_made_from_the_dependencies_listed_now() -> None:
    deps = sorted(PYPROJECT["project"]["dependencies"])
    want = hashlib.sha256(json.dumps(deps).encode()).hexdigest()
    m = re.search(r"^# pyproject-dependencies-sha256: ([0-9a-f]{64})$", RUNTIME.read_text(), flags=re.M)
    assert m, f"{RUNTIME.name} has no pyproject-dependencies-sha256 header: {REFRESH}"
    assert m.group(1) == want, f"pyproject.toml's dependencies changed since {RUNTIME.name} was made: {REFRESH}"


def test_no_extra_leaks_into_the_runtime_lock() -> None:
    locked = set(entries(RUNTIME))
    extras = PYPROJECT["project"]["optional-dependencies"]
    for extra in ("plots", "live"):
        for spec in extras[extra]:
            assert canonicalize_name(Requirement(spec).name) not in locked, f"{spec} ({extra}) is in the runtime lock"
    assert not locked & {"scipy", "numpy", "kubernetes", "pytest"}


def test_the_build_backend_lock_satisfies_the_build_system() -> None:
    locked = entries(BUILD)
    for spec in PYPROJECT["build-system"]["requires"]:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in locked and locked[name][1], f"{req.name} missing from {BUILD.name} or without hashes: {REFRESH}"
        assert req.specifier.contains(locked[name][0]), f"{req.name} {locked[name][0]} does not satisfy {spec}"
