"""Conditions, printer-column summaries, decision history and Kubernetes Events.

Conditions follow ``metav1.Condition``: ``lastTransitionTime`` moves only when the status flips, and each
carries ``observedGeneration``. Events are posted on transitions (a new invalid spec, a decision that acts),
not every cycle, so ``kubectl describe`` stays readable.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from prfaas_core.api import DecisionRecord
from prfaas_core.policy.roles import RoleDecision

from .kube import ApiError, JsonDict, KubeApi

COMPONENT = "prfaas-operator"


def iso(now_s: float) -> str:
    return dt.datetime.fromtimestamp(now_s, tz=dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_iso(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def get_condition(conditions: Iterable[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def set_condition(
    conditions: list[JsonDict],
    type_: str,
    status: bool | str,
    reason: str,
    message: str,
    now_s: float,
    generation: int | None,
) -> list[JsonDict]:
    """A new list with one condition set; the transition time is kept when the status did not change."""
    value = ("True" if status else "False") if isinstance(status, bool) else status
    old = get_condition(conditions, type_)
    since = old["lastTransitionTime"] if old and old.get("status") == value else iso(now_s)
    new: JsonDict = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": since,
    }
    if generation is not None:
        new["observedGeneration"] = generation
    return [c for c in conditions if c.get("type") != type_] + [new]


def format_tokens(tokens: int | None) -> str:
    if tokens is None:
        return ""
    if tokens >= 1 << 30:
        return "inf"
    return f"{tokens / 1000:.1f}K" if tokens >= 1000 else str(tokens)


def decision_record(decision: RoleDecision, now_s: float, threshold_tokens: int | None) -> DecisionRecord:
    return DecisionRecord(
        time=iso(now_s),
        action=decision.action,
        reason=decision.reason[:1024],
        prefill_from=decision.prefill_from,
        decode_from=decision.decode_from,
        prefill_to=decision.prefill_to,
        decode_to=decision.decode_to,
        threshold_tokens=threshold_tokens,
    )


def append_history(history: list[JsonDict], record: JsonDict, limit: int) -> list[JsonDict]:
    """The loop's rule: a Hold is recorded only when its reason differs from the last entry's."""
    if history and record["action"] == "Hold" and history[-1].get("reason") == record["reason"]:
        return history
    return [*history, record][-limit:]


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


def status_changed(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether patching ``new`` would change anything (only the keys in ``new`` are compared)."""
    old = old or {}
    return any(old.get(k) != v for k, v in new.items())
