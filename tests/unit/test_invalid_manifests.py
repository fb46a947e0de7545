"""Every invalid manifest is rejected by BOTH the CRD (schema + CEL, as the API server would) and the
pydantic models, and both name the field the manifest's ``# expect:`` line gives; ``check_document`` reports a
field both reject once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from prfaas_core.api.resources import KINDS_BY_NAME
from prfaas_core.schema.check import check_against_crd
from prfaas_core.schema.crds import crd_schema_by_kind
from prfaas_core.schema.validation import Document, check_document, model_issues

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
    body = yaml.safe_load(path.read_text())
    crd = check_against_crd(crd_schema_by_kind()[body["kind"]], body)
    _, model = model_issues(KINDS_BY_NAME[body["kind"]].model, body)
    for source, issues in (("crd", crd), ("model", model)):
        paths = [i.path for i in issues]
        assert any(p == field or p.startswith(field + ".") or p.startswith(field + "[") for p in paths), (
            f"{source} did not name {field}: {issues}"
        )
    checked = check_document(Document(str(path), 0, body))
    assert not checked.ok
    # one line per problem: a field the CRD rejects is not reported again by the model
    crd_paths = {i.path for i in checked.issues if i.source in ("schema", "cel")}
    assert not [i for i in checked.issues if i.source == "model" and i.path in crd_paths], checked.issues
    # every issue carries a reason a person can act on
    assert all(len(i.message) > 5 for i in checked.issues)
