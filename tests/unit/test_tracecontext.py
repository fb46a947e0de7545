"""The W3C trace context the router and the gateway pass on (prfaas_core.request.tracecontext)."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from prfaas_core.request.tracecontext import START_BYTES, trace_context, valid_traceparent

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
START = bytes(range(1, START_BYTES + 1))


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        (PARENT, True),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", True),  # not sampled: still passed on
        ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later", True),  # a later version may add fields
        (PARENT + "-extra", False),  # version 00 has exactly four fields
        (PARENT.upper(), False),  # lower-case hex only
        ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", False),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", False),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", False),
        ("00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", False),
        ("", False),
        ("garbage", False),
    ],
)
def test_traceparent_validity_follows_the_spec(value: str, valid: bool) -> None:
    assert valid_traceparent(value) is valid


def test_a_clients_context_passes_unchanged_and_case_insensitively() -> None:
    headers = CIMultiDict({"TraceParent": PARENT, "TRACESTATE": "vendor=abc,other=1"})
    assert trace_context(headers, START) == (("traceparent", PARENT), ("tracestate", "vendor=abc,other=1"))


def test_an_oversized_or_unprintable_tracestate_is_dropped_not_cut() -> None:
    assert trace_context({"traceparent": PARENT, "tracestate": "v=" + "x" * 511}) == (("traceparent", PARENT),)
    assert trace_context({"traceparent": PARENT, "tracestate": "v=a\nb"}) == (("traceparent", PARENT),)


def test_without_a_valid_traceparent_a_new_sampled_trace_starts_or_none() -> None:
    started = (("traceparent", f"00-{START[:16].hex()}-{START[16:].hex()}-01"),)
    assert trace_context({}, START) == started
    # a malformed parent takes its tracestate with it
    assert trace_context({"traceparent": "00-bad", "tracestate": "v=1"}, START) == started
    assert trace_context({"traceparent": "00-bad", "tracestate": "v=1"}) == ()  # the gateway starts none
    assert valid_traceparent(started[0][1])
    with pytest.raises(ValueError, match="24 random bytes"):
        trace_context({}, b"short")
