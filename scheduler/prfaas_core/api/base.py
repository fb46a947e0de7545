"""Base classes for the typed API: strict pydantic models whose schema becomes the CRDs.

Conventions (ARCHITECTURE.md): YAML fields are Kubernetes camelCase with the unit in the name
(``capacityGbps``); Python attributes are snake_case (``capacity_gbps``). Unknown fields are errors, not
silently dropped (the same as ``kubectl apply`` with strict field validation).

Cross-field rules are declared once per model as :class:`CelRule` objects: the CEL expression is written
into the CRD (``x-kubernetes-validations``) and the paired Python predicate runs in a pydantic validator,
so the API server and ``prfaas validate`` reject the same objects and name the same field. Tests check the
two halves agree on every invalid example.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, GetJsonSchemaHandler, model_validator
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError

DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


@dataclass(frozen=True)
class CelRule:
    """One cross-field invariant, written twice side by side: CEL for the API server, Python for pydantic.

    ``field_path`` is relative to the object the rule is declared on (Kubernetes' ``fieldPath``, e.g.
    ``.min``); errors name ``<object path><field_path>``.
    """

    rule: str
    message: str
    check: Callable[[Any], bool]
    field_path: str = ""
    reason: str = "FieldValueInvalid"

    def to_crd(self) -> dict[str, str]:
        out = {"rule": self.rule, "message": self.message, "reason": self.reason}
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


class ApiModel(BaseModel):
    """Base of every API model: strict types, camelCase aliases, unknown fields forbidden."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_default=False,
        frozen=True,
    )

    __cel_rules__: ClassVar[tuple[CelRule, ...]] = ()

    @model_validator(mode="after")
    def _check_cel_rules(self) -> ApiModel:
        for rule in type(self).__cel_rules__:
            if not rule.check(self):
                raise PydanticCustomError(
                    "cel_rule",
                    "{message}",
                    {"message": rule.message, "field_path": rule.field_path, "rule": rule.rule},
                )
        return self

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        schema = handler(core_schema)
        if cls.__cel_rules__:
            target = handler.resolve_ref_schema(schema)
            target["x-kubernetes-validations"] = [r.to_crd() for r in cls.__cel_rules__]
        return schema

    def to_manifest(self) -> dict[str, Any]:
        """The object as a Kubernetes manifest would hold it (camelCase, no unset optionals)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def obj_default() -> dict[str, Any]:
    """``json_schema_extra`` for an object field with a default factory: the CRD defaults it to ``{}``."""
    return {"default": {}}


class LocalObjectRef(ApiModel):
    """A reference to another object by name (same namespace, or cluster-scoped)."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN, description="Name of the object.")


class SecretKeyRef(ApiModel):
    """A key inside a Secret in the same namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN, description="Secret name.")
    key: str = Field(min_length=1, max_length=253, description="Key inside the Secret.")


ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(ApiModel):
    """A Kubernetes-style condition (``metav1.Condition``)."""

    type: str = Field(min_length=1, max_length=316, description="Condition type, e.g. Ready, Progressing.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        description="CamelCase machine-readable reason for the last transition.",
    )
    message: str = Field(default="", max_length=32768, description="Human-readable details.")
    last_transition_time: str = Field(
        description="RFC 3339 time the status last changed.", json_schema_extra={"format": "date-time"}
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was computed from."
    )


def conditions_field(types: str) -> Any:
    """A status's ``conditions``: at most 16, a map keyed by ``type`` (``types`` names those the kind sets)."""
    return Field(
        default_factory=list,
        max_length=16,
        description=types,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


class WorkloadRef(ApiModel):
    """The Kubernetes workload that holds engine instances."""

    api_version: str = Field(default="apps/v1", min_length=1, description="API version of the workload.")
    kind: Literal["Deployment", "StatefulSet", "LeaderWorkerSet"] = Field(
        description="Workload kind. LeaderWorkerSet is for multi-node instances (leaderworkerset.x-k8s.io/v1)."
    )
    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN, description="Workload name.")


class ObjectMeta(BaseModel):
    """The parts of ``metadata`` the control plane reads; the rest is kept as-is."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN, description="Object name.")
    namespace: str | None = Field(default=None, pattern=DNS_LABEL_PATTERN, description="Namespace.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations.")
    generation: int | None = Field(default=None, description="Generation, set by the API server.")
