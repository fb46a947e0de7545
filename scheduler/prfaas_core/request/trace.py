"""The project's one request-trace format (planner, simulator, load generator and local stack all use it).

Format: **JSON Lines**, UTF-8, one request per line, ordered by arrival. Each line is a JSON object with
exactly these fields (unknown fields are errors, so typos surface):

==========================  ==========  ====================================================================
field                       type        meaning
==========================  ==========  ====================================================================
``arrival_s``               number      arrival time, seconds from the start of the trace (≥ 0,
                                        non-decreasing from line to line)
``input_tokens``            integer     prompt length in tokens (≥ 1)
``output_tokens``           integer     tokens to generate (≥ 1)
``session_id``              string      conversation / agent session the request belongs to (non-empty)
``shared_prefix_tokens``    integer     tokens shared with the same session's previous request, i.e. the
                                        prefix a cache could hold (0 if none; ≤ ``input_tokens``).
                                        Optional on input (default 0); always written.
==========================  ==========  ====================================================================

Example::

    {"arrival_s": 0.0, "input_tokens": 18000, "output_tokens": 1024, "session_id": "s1", "shared_prefix_tokens": 0}
    {"arrival_s": 0.4, "input_tokens": 21000, "output_tokens": 1024, "session_id": "s1", "shared_prefix_tokens": 18000}

Blank lines are ignored. The *uncached* length the router compares with the threshold ``t`` is
``input_tokens − shared_prefix_tokens`` when the prefix is cached (paper §3.1, "incremental prefill").

The core does no file I/O: :func:`parse_trace` takes lines of text (the CLI opens files) and raises
:class:`TraceError` naming the source, the line number and the field; :func:`dump_trace` serialises.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class TraceError(ValueError):
    """A trace line that does not parse; the message names the source, line and field."""

    def __init__(self, source: str, line: int, message: str) -> None:
        super().__init__(f"{source}:{line}: {message}")
        self.source = source
        self.line = line


class TraceRecord(BaseModel):
    """One request of a trace (field names are the JSON keys; units in the names)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    arrival_s: float = Field(ge=0, description="Arrival time, seconds from the start of the trace.")
    input_tokens: int = Field(ge=1, description="Prompt length, tokens.")
    output_tokens: int = Field(ge=1, description="Tokens to generate.")
    session_id: str = Field(min_length=1, description="Session the request belongs to.")
    shared_prefix_tokens: int = Field(
        default=0, ge=0, description="Tokens shared with the session's previous request (0 if none)."
    )

    @model_validator(mode="after")
    def _prefix_within_input(self) -> TraceRecord:
        if self.shared_prefix_tokens > self.input_tokens:
            raise ValueError("shared_prefix_tokens exceeds input_tokens")
        return self

    @property
    def uncached_tokens(self) -> int:
        """Prefill work left when the shared prefix is cached: ``input_tokens − shared_prefix_tokens``."""
        return self.input_tokens - self.shared_prefix_tokens

    def to_json_line(self) -> str:
        """The record as one JSONL line (no trailing newline), keys in the documented order."""
        return json.dumps(self.model_dump(mode="json"), separators=(", ", ": "))


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        parts.append(f"field '{loc}': {e['msg']}" if loc else e["msg"])
    return "; ".join(parts)


def parse_trace(lines: Iterable[str], source: str = "<trace>") -> tuple[TraceRecord, ...]:
    """Parse JSONL text into records, checking each line and the arrival order.

    Raises :class:`TraceError` at the first bad line (``source:line: field 'x': why``), or for a trace with no
    requests at all.
    """
    records: list[TraceRecord] = []
    last_arrival = 0.0
    lineno = 0
    for lineno, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text:
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(source, lineno, f"not valid JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise TraceError(source, lineno, "each line must be a JSON object")
        try:
            record = TraceRecord.model_validate(obj)
        except ValidationError as exc:
            raise TraceError(source, lineno, _describe(exc)) from None
        if records and record.arrival_s < last_arrival:
            raise TraceError(
                source,
                lineno,
                f"field 'arrival_s': {record.arrival_s} is before the previous line's {last_arrival} "
                "(a trace is ordered by arrival)",
            )
        last_arrival = record.arrival_s
        records.append(record)
    if not records:
        raise TraceError(source, max(lineno, 1), "the trace holds no requests")
    return tuple(records)


def dump_trace(records: Sequence[TraceRecord]) -> str:
    """Serialise records as JSONL text (one line each, newline-terminated)."""
    return "".join(r.to_json_line() + "\n" for r in records)
