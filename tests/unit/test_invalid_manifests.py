"""Every invalid manifest is rejected by BOTH the CRD (schema + CEL, as the API server would) and the
pydantic models, and both name the field the manifest's ``# expect:`` line gives."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from prfaas_core.schema.validation import Document, check_document

INVALID = Path(__file__).resolve().parents[1] / "data" / "invalid"
FILES = sorted(INVALID.glob("*.yaml"))


def expected_field(path: Path) -> str:
    match = re.search(r"^# expect: (\S+)$", path.read_text(), re.MULTILINE)
    assert match, f"{path.name} has no '# expect:' line"
    return match.group(1)


def test_there_are_at_least_30_invalid_manifests() -> None:
    assert len(FILES) >= 30


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_rejected_by_crd_and_model_naming_the_field(path: Path) -> None:
    field = expected_field(path)
    checked = check_document(Document(str(path), 0, yaml.safe_load(path.read_text())))
    by_source: dict[str, list[str]] = {}
    for issue in checked.issues:
        by_source.setdefault("crd" if issue.source in ("schema", "cel") else issue.source, []).append(issue.path)
    assert not checked.ok
    for source in ("crd", "model"):
        paths = by_source.get(source, [])
        assert any(p == field or p.startswith(field + ".") or p.startswith(field + "[") for p in paths), (
            f"{source} did not name {field}: {checked.issues}"
        )
    # every issue carries a reason a person can act on
    assert all(len(i.message) > 5 for i in checked.issues)
