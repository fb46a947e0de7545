"""A request ledger for the chaos suite: every request sent while a fault is in force, and how it was answered.

An answer is one of: ``success`` (200 over the route it was meant to take), ``fallback``/``retry`` (200 over
the other cluster or another instance: the ``x-prfaas-route`` header), ``clean-error`` (a documented status —
429 with Retry-After, 502, 503 — with an OpenAI error body naming why), and ``lost``: a hang past the client's
timeout, a refused connection, or a 5xx without an error body. The suite asserts nothing is lost.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
from testbed_support import prompt

DOCUMENTED = {429, 502, 503}


def record(fault: str, **row: object) -> None:
    """One row of the chaos table (fault, what clients saw, recovery, metric and log line) to
    ``$PRFAAS_CHAOS_TABLE`` when set."""
    path = os.environ.get("PRFAAS_CHAOS_TABLE")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"fault": fault, **row}) + "\n")


@dataclass(frozen=True)
class Entry:
    fault: str
    sent_s: float
    seconds: float
    status: int | None
    route: str | None
    outcome: str
    detail: str


@dataclass
class Ledger:
    router: str
    entries: list[Entry] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, client: httpx.Client, fault: str, tokens: int) -> Entry:
        t0 = time.monotonic()
        status = route = None
        try:
            r = client.post(f"{self.router}/v1/completions", json={"prompt": prompt(tokens), "max_tokens": 3})
            status, route = r.status_code, r.headers.get("x-prfaas-route")
            outcome, detail = self._classify(r)
        except httpx.HTTPError as exc:
            outcome, detail = "lost", f"{exc.__class__.__name__}: {exc}"
        entry = Entry(fault, t0, time.monotonic() - t0, status, route, outcome, detail)
        with self._lock:
            self.entries.append(entry)
        return entry

    @staticmethod
    def _classify(r: httpx.Response) -> tuple[str, str]:
        if r.status_code == 200:
            route = r.headers.get("x-prfaas-route", "")
            return ("success" if route in ("local", "remote") else route or "success"), route
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            return "lost", f"{r.status_code} without an error body: {r.text[:200]}"
        if r.status_code in DOCUMENTED and message:
            return "clean-error", f"{r.status_code}: {message[:160]}"
        return "lost", f"undocumented {r.status_code}: {message[:160]}"

    @contextmanager
    def traffic(self, fault: str, workers: int = 2, long_every: int = 2) -> Iterator[None]:
        """Requests flow (short and long, alternately) on ``workers`` threads while the block runs."""
        stop = threading.Event()

        def worker(k: int) -> None:
            with httpx.Client(timeout=60) as client:
                i = k
                while not stop.is_set():
                    self.send(client, fault, 40_000 if i % long_every == 0 else 500)
                    i += 1

        threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(workers)]
        for t in threads:
            t.start()
        try:
            yield
        finally:
            stop.set()
            for t in threads:
                t.join(90)

    def of(self, fault: str) -> list[Entry]:
        with self._lock:
            return [e for e in self.entries if e.fault == fault]

    def summary(self, fault: str) -> dict[str, int]:
        return dict(Counter(e.outcome for e in self.of(fault)))

    def assert_all_answered(self, fault: str) -> None:
        entries = self.of(fault)
        assert entries, f"no traffic during {fault}"
        lost = [e for e in entries if e.outcome == "lost"]
        assert not lost, f"{fault}: {len(lost)} of {len(entries)} lost, e.g. {lost[0]}"
