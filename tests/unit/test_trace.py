"""The JSONL trace format: parse, serialise, and errors that name the line and the field."""

from __future__ import annotations

import json

import pytest

from prfaas_core.request.trace import TraceError, TraceRecord, dump_trace, parse_trace

GOOD = [
    '{"arrival_s": 0.0, "input_tokens": 18000, "output_tokens": 1024, "session_id": "s1", "shared_prefix_tokens": 0}',
    "",
    '{"arrival_s": 0.4, "input_tokens": 21000, "output_tokens": 512, "session_id": "s1", '
    '"shared_prefix_tokens": 18000}',
    '{"arrival_s": 1, "input_tokens": 300, "output_tokens": 8, "session_id": "s2"}',
]


def test_parses_records_skipping_blank_lines() -> None:
    records = parse_trace(GOOD)
    assert len(records) == 3
    assert records[1] == TraceRecord(
        arrival_s=0.4, input_tokens=21000, output_tokens=512, session_id="s1", shared_prefix_tokens=18000
    )
    assert records[1].uncached_tokens == 3000
    assert records[2].shared_prefix_tokens == 0  # optional on input
    assert records[2].arrival_s == 1.0


def test_round_trips_and_always_writes_every_field() -> None:
    records = parse_trace(GOOD)
    text = dump_trace(records)
    assert text.endswith("\n") and text.count("\n") == 3
    assert parse_trace(text.splitlines()) == records
    first = json.loads(text.splitlines()[2])
    assert list(first) == ["arrival_s", "input_tokens", "output_tokens", "session_id", "shared_prefix_tokens"]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"arrival_s": 0, "output_tokens": 1, "session_id": "a"}', "field 'input_tokens'"),
        ('{"arrival_s": 0, "input_tokens": 1.5, "output_tokens": 1, "session_id": "a"}', "field 'input_tokens'"),
        ('{"arrival_s": -1, "input_tokens": 1, "output_tokens": 1, "session_id": "a"}', "field 'arrival_s'"),
        ('{"arrival_s": 0, "input_tokens": 1, "output_tokens": 1, "session_id": ""}', "field 'session_id'"),
        ('{"arrival_s": 0, "input_tokens": 1, "output_tokens": 1, "session_id": "a", "x": 1}', "field 'x'"),
        (
            '{"arrival_s": 0, "input_tokens": 10, "output_tokens": 1, "session_id": "a", "shared_prefix_tokens": 11}',
            "shared_prefix_tokens exceeds input_tokens",
        ),
    ],
)
def test_bad_line_names_source_line_and_field(line: str, expected: str) -> None:
    with pytest.raises(TraceError) as err:
        parse_trace([GOOD[0], line], source="t.jsonl")
    assert str(err.value).startswith("t.jsonl:2: ")
    assert expected in str(err.value)
    assert err.value.line == 2


def test_arrivals_must_not_go_backwards() -> None:
    lines = [GOOD[2], GOOD[0]]
    with pytest.raises(TraceError, match=r"<trace>:2: field 'arrival_s': 0.0 is before"):
        parse_trace(lines)


def test_an_empty_trace_is_an_error() -> None:
    with pytest.raises(TraceError, match="holds no requests"):
        parse_trace(["", "  "], source="empty.jsonl")


def test_records_are_frozen() -> None:
    record = parse_trace(GOOD)[0]
    with pytest.raises(ValueError):
        record.input_tokens = 5  # type: ignore[misc]
