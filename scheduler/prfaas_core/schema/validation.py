"""Validation of manifests: each object against the CRD (schema + CEL) *and* the pydantic models, then
across objects (dangling references, duplicates, the engines' configuration, the fleet graph of
:mod:`.fleet_graph`). Pure: takes parsed documents, returns issues.

Both per-object checkers run on every object so that a disagreement between the CRD and the models is
visible (the test suite requires they reject the same invalid manifests and name the same field); a field both
reject is reported once (the CRD's finding, as the API server would word it).

References to objects that are not among the documents are *unresolved*: in a per-file check (a GitOps
pipeline validating one manifest at a time) they are reported as such and do not make the object invalid;
``strict_references=True`` (a whole-tree check) makes each an error.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ..api.base import ApiModel
from ..api.resources import KINDS_BY_NAME
from ..names import API_GROUP, GROUP_VERSION
from .check import Issue, check_against_crd, format_path
from .crds import crd_schema_by_kind
from .engine_checks import engine_issues
from .fleet_graph import graph_issues


@dataclass
class Document:
    """One YAML document of one file."""

    source: str
    index: int
    body: Any

    @property
    def kind(self) -> str:
        return str(self.body.get("kind", "")) if isinstance(self.body, dict) else ""

    @property
    def name(self) -> str:
        if isinstance(self.body, dict) and isinstance(self.body.get("metadata"), dict):
            return str(self.body["metadata"].get("name", ""))
        return ""

    @property
    def namespace(self) -> str | None:
        if isinstance(self.body, dict) and isinstance(self.body.get("metadata"), dict):
            ns = self.body["metadata"].get("namespace")
            return str(ns) if ns is not None else None
        return None

    @property
    def label(self) -> str:
        if not self.kind and not self.name:
            return f"{self.source}#{self.index}"
        return f"{self.source}#{self.index} {self.kind or '?'}/{self.name or '?'}"


@dataclass
class Checked:
    """A document with what the checks found; ``model`` is set when the pydantic models accept it."""

    document: Document
    issues: list[Issue] = field(default_factory=list)
    model: ApiModel | None = None
    skipped: str | None = None
    warnings: list[Issue] = field(default_factory=list)
    """Findings that do not make the object invalid (e.g. a hybrid model's connector limits)."""
    unresolved: list[Issue] = field(default_factory=list)
    """References to objects not among the documents checked (errors instead with ``strict_references``)."""

    @property
    def ok(self) -> bool:
        return not self.issues


def model_issues(model: type[ApiModel], body: Any) -> tuple[ApiModel | None, list[Issue]]:
    """Validate with pydantic; each error names its field (CEL-paired rules add their fieldPath)."""
    try:
        return model.model_validate(body), []
    except ValidationError as exc:
        issues = []
        for err in exc.errors(include_url=False):
            path = format_path(err["loc"])
            ctx = err.get("ctx") or {}
            if err["type"] == "cel_rule":
                path += str(ctx.get("field_path", ""))
                message = str(ctx.get("message", err["msg"]))
            elif err["type"] == "missing":
                message = "Required value: field is required"
            elif err["type"] == "extra_forbidden":
                message = f"unknown field(s) {err['loc'][-1]!r}"
            else:
                message = f"{err['msg']} (got {err.get('input')!r})"
            issues.append(Issue(path, message, "model"))
        return None, issues


def validation_message(source: str, exc: ValidationError) -> str:
    """A pydantic error as the CLI prints it: one ``source: field: message`` line per error (a CEL-paired rule
    names its fieldPath and says its own message)."""
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(x) for x in err["loc"])
        ctx = err.get("ctx") or {}
        msg = str(ctx.get("message", err["msg"])) if err["type"] == "cel_rule" else err["msg"]
        parts.append(f"{source}: {loc + str(ctx.get('field_path', '')) or '<root>'}: {msg}")
    return "\n".join(parts)


NOT_A_MANIFEST = "not a Kubernetes manifest (no kind): not checked"
"""Why a YAML mapping without a kind (a Helm values file, a Chart.yaml, a scenario) is skipped. One that names a
PrFaaS apiVersion but no kind is an error instead."""


def merge_issues(crd: list[Issue], model: list[Issue]) -> list[Issue]:
    """The CRD's findings, then the model's on fields the CRD found nothing wrong with: one line per problem."""
    seen = {i.path for i in crd}
    return crd + [i for i in model if i.path not in seen]


def check_document(doc: Document) -> Checked:
    """Run the CRD check and the model check on one document."""
    body = doc.body
    if not isinstance(body, dict):
        return Checked(doc, [Issue("", "document is not a mapping (an object with apiVersion and kind)", "document")])
    if "kind" not in body and not str(body.get("apiVersion", "")).startswith(f"{API_GROUP}/"):
        return Checked(doc, skipped=NOT_A_MANIFEST)
    api_version = body.get("apiVersion")
    kind = body.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return Checked(doc, [Issue("", "apiVersion and kind are required", "document")])
    if api_version.split("/")[0] != API_GROUP:
        return Checked(doc, skipped=f"{api_version} {kind} is not a {API_GROUP} kind; not checked here")
    if api_version != GROUP_VERSION:
        return Checked(
            doc,
            [Issue("apiVersion", f"unsupported version {api_version!r}; use {GROUP_VERSION}", "document")],
        )
    resource = KINDS_BY_NAME.get(kind)
    if resource is None:
        known = ", ".join(sorted(KINDS_BY_NAME))
        return Checked(doc, [Issue("kind", f"unknown kind {kind!r}; known kinds: {known}", "document")])
    issues = check_against_crd(crd_schema_by_kind()[kind], body)
    if not isinstance(body.get("metadata"), dict) or not body["metadata"].get("name"):
        issues.append(Issue("metadata.name", "Required value: name is required", "schema"))
    if not resource.namespaced and isinstance(body.get("metadata"), dict) and body["metadata"].get("namespace"):
        issues.append(Issue("metadata.namespace", f"{kind} is cluster-scoped; remove the namespace", "schema"))
    model, found = model_issues(resource.model, body)
    return Checked(doc, merge_issues(issues, found), model=model)


def _key(doc: Document, default_namespace: str) -> tuple[str, str | None, str]:
    namespaced = KINDS_BY_NAME[doc.kind].namespaced
    return (doc.kind, (doc.namespace or default_namespace) if namespaced else None, doc.name)


def _mode(doc: Document) -> str:
    """A PrefillCluster's mode: region A's Managed object and region B's Remote description of the same
    cluster share a name on two API servers, so they are not duplicates of each other."""
    spec = doc.body.get("spec") if isinstance(doc.body, dict) else None
    return str(spec.get("mode", "Managed")) if isinstance(spec, dict) else "Managed"


def _same_remote(a: Document, b: Document) -> bool:
    """Two identical Remote descriptions of one PrefillCluster (several regions' files checked at once)."""
    return a.kind == "PrefillCluster" and _mode(a) == "Remote" and a.body.get("spec") == b.body.get("spec")


def cross_object_issues(
    checked: Sequence[Checked], default_namespace: str = "default"
) -> tuple[dict[int, list[Issue]], dict[int, list[Issue]]]:
    """Duplicates among the objects, and references to objects not among them: (duplicates, unresolved), each
    by position in ``checked``.

    References: PrefillCluster/PDCluster -> ModelProfile (cluster-scoped); InterDCLink -> PrefillCluster and
    PDCluster in its own namespace. The API server cannot check these (CEL sees one object); the operator
    reports them as ``Ready=False`` conditions.
    """
    ours = [(i, c) for i, c in enumerate(checked) if c.skipped is None and c.document.kind in KINDS_BY_NAME]
    defined: dict[tuple[str, str | None, str], int] = {}
    seen: dict[tuple[str | None, ...], int] = {}
    out: dict[int, list[Issue]] = {}
    unresolved: dict[int, list[Issue]] = {}
    for i, c in ours:
        if not c.document.name:
            continue
        key = _key(c.document, default_namespace)
        dup_key: tuple[str | None, ...] = (*key, _mode(c.document)) if c.document.kind == "PrefillCluster" else key
        if dup_key in seen and _same_remote(checked[seen[dup_key]].document, c.document):
            continue  # a fleet's regions each describe the site they use: the same description is no duplicate
        if dup_key in seen:
            first = checked[seen[dup_key]].document
            out.setdefault(i, []).append(
                Issue(
                    "metadata.name",
                    f"duplicate {c.document.kind} {c.document.name!r} (also {first.label})",
                    "reference",
                )
            )
        else:
            seen[dup_key] = i
            defined.setdefault(key, i)
    for i, c in ours:
        body = c.document.body
        spec = body.get("spec") if isinstance(body.get("spec"), dict) else {}
        ns = c.document.namespace or default_namespace
        refs: list[tuple[str, str, str | None]] = []
        if c.document.kind in ("PrefillCluster", "PDCluster"):
            refs.append(("modelProfileRef", "ModelProfile", None))
        if c.document.kind == "InterDCLink":
            refs += [("prefillClusterRef", "PrefillCluster", ns), ("pdClusterRef", "PDCluster", ns)]
        for field_name, kind, ref_ns in refs:
            ref = spec.get(field_name)
            name = ref.get("name") if isinstance(ref, dict) else None
            if isinstance(name, str) and (kind, ref_ns, name) not in defined:
                where = f" in namespace {ref_ns!r}" if ref_ns else ""
                unresolved.setdefault(i, []).append(
                    Issue(
                        f"spec.{field_name}.name",
                        f"{kind} {name!r}{where} is not defined in the given files",
                        "reference",
                    )
                )
    return out, unresolved


def validate_documents(
    docs: Iterable[Document], default_namespace: str = "default", strict_references: bool = True
) -> list[Checked]:
    """Check every document, then the references between them. With ``strict_references`` a reference to an
    object not among ``docs`` is an error; without, it is listed in ``Checked.unresolved``."""
    checked = [check_document(d) for d in docs]
    duplicates, unresolved = cross_object_issues(checked, default_namespace)
    for i, extra in duplicates.items():
        checked[i].issues.extend(extra)
    for i, extra in unresolved.items():
        (checked[i].issues if strict_references else checked[i].unresolved).extend(extra)
    models = [c.model for c in checked]
    for errors, warnings in (engine_issues(models, default_namespace), graph_issues(models, default_namespace)):
        for i, extra in errors.items():
            checked[i].issues.extend(extra)
        for i, extra in warnings.items():
            checked[i].warnings.extend(extra)
    return checked
