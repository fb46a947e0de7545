"""W3C Trace Context (https://www.w3.org/TR/trace-context/) as the router and the gateway pass it on: a client's
``traceparent`` (and its ``tracestate``) travels unchanged on every leg to the engines, so that vLLM's own spans
(``--otlp-traces-endpoint``) join the client's trace. The router starts a trace for a request that brings none
(sampled, as vLLM samples a request without one), so that the prefill and decode legs of one request share it.
A malformed ``traceparent`` is not passed on (the spec: a receiver restarts the trace) and takes its
``tracestate`` with it."""

from __future__ import annotations

import re
from collections.abc import Mapping

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

TRACESTATE_MAX_CHARS = 512
"""The spec's floor of what a platform must propagate; a longer ``tracestate`` is dropped, not cut (a cut list
member would be corrupt)."""

START_BYTES = 24
"""Random bytes :func:`trace_context` needs to start a trace: 16 for the trace id, 8 for the parent id."""

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


def valid_traceparent(value: str) -> bool:
    """Whether ``value`` is a ``traceparent`` a receiver may use: lower-case hex, version ``ff`` never, no
    all-zero trace or parent id, and version ``00`` exactly 55 characters (a later version may append fields)."""
    m = _TRACEPARENT.fullmatch(value)
    if m is None:
        return False
    version, trace_id, parent_id, _, rest = m.groups()
    if version == "ff" or trace_id == "0" * 32 or parent_id == "0" * 16:
        return False
    return not (version == "00" and rest is not None)


def trace_context(headers: Mapping[str, str], start: bytes | None = None) -> tuple[tuple[str, str], ...]:
    """The trace headers to pass on for a request with ``headers`` (a case-insensitive mapping, as a server
    framework gives it): the client's ``traceparent`` when valid, with its ``tracestate`` when it fits
    :data:`TRACESTATE_MAX_CHARS`; else, with ``start`` (:data:`START_BYTES` random bytes), a new sampled trace;
    else none."""
    parent = headers.get(TRACEPARENT, "").strip()
    if valid_traceparent(parent):
        state = headers.get(TRACESTATE, "").strip()
        if state and len(state) <= TRACESTATE_MAX_CHARS and state.isprintable():
            return ((TRACEPARENT, parent), (TRACESTATE, state))
        return ((TRACEPARENT, parent),)
    if start is None:
        return ()
    if len(start) != START_BYTES:
        raise ValueError(f"trace_context: start must be {START_BYTES} random bytes, got {len(start)}")
    trace_id, parent_id = start[:16].hex(), start[16:].hex()
    if trace_id == "0" * 32 or parent_id == "0" * 16:  # 2^-64 at worst; the spec forbids all-zero ids
        return ()
    return ((TRACEPARENT, f"00-{trace_id}-{parent_id}-01"),)
