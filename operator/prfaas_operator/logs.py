"""structlog JSON logs: one JSON object per line, always with the resource's namespace and name."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to standard error as it is at each record, not as it was when logging was configured (an operator run
    in-process, as a test may, must not leave its logs bound to a stream closed afterwards)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _: Any) -> None:
        pass


POD_EVENT_HANDLER = "Handler 'pod-event-"
"""How kopf names our pod-event handlers in its log lines (handlers.py registers them as ``pod-event-<label>``)."""


class _PodEventSucceeded(logging.Filter):
    """Drops kopf's ``Handler 'pod-event-…' succeeded.`` INFO line: kopf writes one for every pod watch event (a
    re-listed fleet of thousands of pods wrote thousands of lines; rendering them was a tenth of the operator's
    CPU at rest), and it says nothing (the handler only caches the pod). kopf's other lines, and a pod-event
    handler's failures, still pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        return not (isinstance(msg, str) and msg.startswith(POD_EVENT_HANDLER) and msg.endswith("' succeeded."))


def configure(level: str = "INFO") -> None:
    """JSON lines on stderr for our loggers and kopf's: structlog's events go through the standard library's logging,
    so ours and kopf's own records leave by one handler and one renderer."""
    lvl = getattr(logging, level.upper(), logging.INFO)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
    handler = _StderrHandler()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(),
            ],
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name, _kopf_object],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(lvl)
    objects = logging.getLogger("kopf.objects")
    if not any(isinstance(f, _PodEventSucceeded) for f in objects.filters):
        objects.addFilter(_PodEventSucceeded())
    for noisy in ("httpx", "httpcore", "urllib3", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _kopf_object(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """kopf passes the object as ``k8s_ref`` (or in ``extra``); lift namespace/name to the top level."""
    record = event.get("_record")
    ref = getattr(record, "k8s_ref", None) if record is not None else None
    if isinstance(ref, dict):
        event.setdefault("namespace", ref.get("namespace"))
        event.setdefault("name", ref.get("name"))
        event.setdefault("kind", ref.get("kind"))
    return event


def logger(kind: str, namespace: str | None, name: str, **extra: Any) -> Any:
    """A bound logger for one resource: every line carries kind, namespace and name."""
    return structlog.get_logger("prfaas_operator").bind(kind=kind, namespace=namespace, name=name, **extra)
