"""The operator's logs: one JSON object per line on standard error as it is when the line is written (ours and
kopf's records by one handler), so an operator run in-process does not stay bound to a stream closed after it."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest
import structlog

from prfaas_operator import logs


@pytest.fixture
def restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        structlog.reset_defaults()
        root.handlers[:], root.level = handlers, level


def test_lines_follow_stderr_after_it_was_replaced_and_kopf_records_share_the_renderer(
    restored: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    logs.configure("info")
    logs.logger("PDCluster", "ns", "a").info("reconciled", flips=1)
    first.close()  # what a test's capture does to the stream the logs were configured with
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    logs.logger("PDCluster", "ns", "a").info("after the close", flips=2)
    logs.logger("PDCluster", "ns", "a").debug("below the level")
    ref = {"namespace": "ns", "name": "b", "kind": "PrefillCluster"}
    logging.getLogger("kopf.objects").warning("handler retried", extra={"k8s_ref": ref})
    lines = [json.loads(line) for line in second.getvalue().splitlines()]
    assert [line["event"] for line in lines] == ["after the close", "handler retried"]
    assert lines[0] | {"timestamp": None} == {
        "kind": "PDCluster",
        "namespace": "ns",
        "name": "a",
        "flips": 2,
        "event": "after the close",
        "level": "info",
        "timestamp": None,
    }
    assert (lines[1]["namespace"], lines[1]["name"], lines[1]["kind"], lines[1]["level"]) == (
        "ns",
        "b",
        "PrefillCluster",
        "warning",
    )


def test_kopf_pod_event_success_lines_are_dropped_and_its_other_lines_pass(
    restored: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    logs.configure("info")
    logs.configure("info")  # configured twice (a test's in-process operator): one filter still
    objects = logging.getLogger("kopf.objects")
    assert sum(isinstance(f, logs._PodEventSucceeded) for f in objects.filters) == 1
    objects.info("Handler 'pod-event-prfaas.io/pd-cluster' succeeded.")
    objects.info("Handler 'changed' succeeded.")
    objects.error("Handler 'pod-event-prfaas.io/pd-cluster' failed with an exception. Will retry.")
    lines = [json.loads(line)["event"] for line in out.getvalue().splitlines()]
    assert lines == [
        "Handler 'changed' succeeded.",
        "Handler 'pod-event-prfaas.io/pd-cluster' failed with an exception. Will retry.",
    ]
