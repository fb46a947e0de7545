"""Conditions, printer-column formatting, Kubernetes Events, and our own status as the core's models.

Conditions follow ``metav1.Condition`` (the core's :class:`~prfaas_core.api.Condition`): ``lastTransitionTime``
moves only when the status flips, and each carries ``observedGeneration``. Events are posted on transitions
(a new invalid spec, a decision that acts), not every cycle, so ``kubectl describe`` stays readable.

Our own resources' status is read through the core's pydantic models (:func:`read_status`) and written as
one (:func:`status_patch`): no camelCase dict walking.
"""

from __future__ import annotations

import contextlib
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import ValidationError

from prfaas_core.api import ApiModel, Condition
from prfaas_core.api.common import parse_rfc3339, rfc3339
from prfaas_core.names import KIND_INTER_DC_LINK, KIND_PD_CLUSTER, KIND_PREFILL_CLUSTER, NO_THRESHOLD_TOKENS
from prfaas_core.policy.long_term import wording

from .kube import ApiError, JsonDict, KubeApi

S = TypeVar("S", bound=ApiModel)

COMPONENT = "prfaas-operator"


iso = rfc3339
parse_iso = parse_rfc3339


def get_condition(conditions: Sequence[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def condition_true(conditions: Sequence[Condition], type_: str) -> bool:
    c = get_condition(conditions, type_)
    return c is not None and c.status == "True"


def set_condition(
    conditions: Sequence[Condition],
    type_: str,
    status: bool | str,
    reason: str,
    message: str,
    now_s: float,
    generation: int | None,
) -> list[Condition]:
    """A new list with one condition set, in its old place (a condition set again must not move: the list's
    order is part of what the status writer compares); the transition time is kept when the status did not
    change."""
    value = ("True" if status else "False") if isinstance(status, bool) else status
    old = get_condition(conditions, type_)
    since = old.last_transition_time if old is not None and old.status == value else iso(now_s)
    new = Condition(
        type=type_,
        status=value,  # type: ignore[arg-type]  # "True"/"False"/"Unknown" by construction
        reason=reason,
        message=message[:32768],
        last_transition_time=since,
        observed_generation=generation,
    )
    if old is None:
        return [*conditions, new]
    return [new if c.type == type_ else c for c in conditions]


def changed_reason(old: Condition | None, reason: str, message: str) -> bool:
    """Whether a condition's reason or message differs from ``old``'s (an Event is posted on a change)."""
    return old is None or old.reason != reason or old.message != message


def read_status(model: type[S], status: Mapping[str, Any]) -> S:
    """Our own status through the core's model. Lenient, since status is ours but may come from an older
    operator: a field that no longer parses is dropped (and rewritten by the next reconcile)."""
    data = dict(status)
    for _ in range(len(data) + 1):
        try:
            return model.model_validate(data, strict=False)
        except ValidationError as exc:
            bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
            if not bad & data.keys():
                break
            data = {k: v for k, v in data.items() if k not in bad}
    return model()


def status_patch(status: ApiModel) -> JsonDict:
    """The fields set on ``status`` as a merge patch of the status subresource: camelCase, nested objects
    without unset optionals, and a field set to None removes it."""
    full = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    fields = type(status).model_fields
    out: JsonDict = {}
    for name in status.model_fields_set:
        alias = fields[name].alias or name
        out[alias] = full.get(alias)
    return out


def format_tokens(tokens: int | None) -> str:
    if tokens is None:
        return ""
    if tokens >= NO_THRESHOLD_TOKENS:
        return "inf"
    return f"{tokens / 1000:.1f}K" if tokens >= 1000 else str(tokens)


async def post_event(
    api: KubeApi,
    involved: Mapping[str, Any],
    type_: str,
    reason: str,
    message: str,
    now_s: float,
) -> None:
    """A core/v1 Event about ``involved`` (its apiVersion, kind, metadata). Failures are not fatal."""
    meta = involved.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    name = f"{meta.get('name', 'object')}.{uuid.uuid4().hex[:12]}"
    stamp = iso(now_s)
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": {
            "apiVersion": involved.get("apiVersion"),
            "kind": involved.get("kind"),
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
        },
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
    }
    with contextlib.suppress(ApiError):
        await api.create(f"/api/v1/namespaces/{namespace}/events", body)


@dataclass(frozen=True)
class QuietRule:
    """Which status fields alone do not make a write (a controller writes status when it changes, not to say
    that it is alive). Paths are camelCase, nested with dots (``lastDecision.time``).

    - ``heartbeat``: timestamps that only say "still fresh": rewritten with whatever else changes, or alone
      once the written one is ``heartbeat_s`` old (as a condition's ``lastTransitionTime`` moves only on a
      transition; kubelet's node status uses the same idea, 5 minutes).
    - ``tolerance``: measured numbers, rewritten when they move past ``(absolute, relative)``: more than
      ``max(absolute, relative * max(|old|, |new|))``; a value appearing or vanishing always counts.
    - ``follows``: fields derived from others (a percentage string): never a reason to write on their own.
    - ``wording``: texts that carry measured figures (a repeated Hold's reason): compared with their figures
      masked (the core's :func:`~prfaas_core.policy.long_term.wording`, the rule its decision history keeps),
      so new figures are written with whatever else changes, or with the heartbeat.
    """

    heartbeat: tuple[str, ...] = ()
    tolerance: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    follows: tuple[str, ...] = ()
    wording: tuple[str, ...] = ()


STATUS_HEARTBEAT_S = 300.0
"""How old a heartbeat timestamp may grow before it is rewritten alone (``--status-heartbeat-seconds``)."""

QUIET_RULES: Mapping[str, QuietRule] = {
    KIND_INTER_DC_LINK: QuietRule(
        heartbeat=("lastMeasuredTime",),
        tolerance={"utilization": (0.01, 0.0), "thresholdFloorTokens": (0.0, 0.02)},
        follows=("measuredEgressGbps", "utilizationPercent"),
    ),
    KIND_PREFILL_CLUSTER: QuietRule(
        heartbeat=("lastSyncTime",),
        tolerance={
            "queueDepth": (1.0, 0.0),
            "measuredPrefillTokensPerSecond": (1.0, 0.05),
            "egressGbps": (0.05, 0.05),
        },
    ),
    KIND_PD_CLUSTER: QuietRule(heartbeat=("lastDecision.time",), wording=("lastDecision.reason",)),
}
"""Per kind, what its status writes may leave alone (the CRD field descriptions say the same). A kind not
listed is compared exactly."""


def _age_s(old: Any, new: Any) -> float:
    """Seconds from timestamp ``old`` to ``new`` (inf where either does not parse: then it is written)."""
    a, b = parse_iso(old) if isinstance(old, str) else None, parse_iso(new) if isinstance(new, str) else None
    return math.inf if a is None or b is None else b - a


def _moved(old: Any, new: Any, absolute: float, relative: float) -> bool:
    if not isinstance(old, int | float) or not isinstance(new, int | float):
        return bool(old != new)
    return abs(new - old) > max(absolute, relative * max(abs(old), abs(new)))


def _field_changed(path: str, old: Any, new: Any, rule: QuietRule, heartbeat_s: float) -> bool:
    if path in rule.follows:
        return False
    if path in rule.heartbeat:
        return old is None or _age_s(old, new) >= heartbeat_s
    if path in rule.tolerance:
        return _moved(old, new, *rule.tolerance[path])
    if path in rule.wording and isinstance(old, str) and isinstance(new, str):
        return wording(old) != wording(new)
    prefix = path + "."
    beats = tuple(h[len(prefix) :] for h in rule.heartbeat if h.startswith(prefix))
    words = tuple(w[len(prefix) :] for w in rule.wording if w.startswith(prefix))
    if (beats or words) and isinstance(old, Mapping) and isinstance(new, Mapping):
        inner = QuietRule(heartbeat=beats, wording=words)
        keys = old.keys() | new.keys()
        return any(_field_changed(k, old.get(k), new.get(k), inner, heartbeat_s) for k in keys)
    return bool(old != new)


def changed_fields(
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any],
    rule: QuietRule | None = None,
    heartbeat_s: float = STATUS_HEARTBEAT_S,
) -> list[str]:
    """The keys of ``new`` whose change is worth a write (only the keys in ``new`` are compared; ``rule`` says
    which fields alone are not worth one)."""
    old = old or {}
    rule = rule or QuietRule()
    return [k for k, v in new.items() if _field_changed(k, old.get(k), v, rule, heartbeat_s)]


def status_changed(
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any],
    rule: QuietRule | None = None,
    heartbeat_s: float = STATUS_HEARTBEAT_S,
) -> bool:
    """Whether patching ``new`` would change anything worth a write."""
    return bool(changed_fields(old, new, rule, heartbeat_s))
