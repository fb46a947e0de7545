"""The namespace harness on the real kernel (needs root): two namespaces, a shaped veth, its counters, a cut and a
restore, a forwarder into a namespace, and everything gone afterwards — also when the owner was SIGKILLed."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from prfaas_local.netns import LinkShape, NetnsPair, NetnsUnavailable, clean_leftovers
from support.real_engines import skip_or_fail

PAYLOAD = 400_000


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[NetnsPair]:
    p = NetnsPair(LinkShape(rate_mbit=16, burst_bytes=16_384))
    try:
        p.create()
    except NetnsUnavailable as exc:
        skip_or_fail(f"network namespaces refused: {exc}")
    try:
        yield p
    finally:
        p.close()
    assert p.ns_a not in _namespaces() and p.ns_b not in _namespaces()


def _serve(pair: NetnsPair, tmp_path: Path) -> subprocess.Popen[bytes]:
    (tmp_path / "blob").write_bytes(b"k" * PAYLOAD)
    argv = [*pair.exec_prefix("a"), sys.executable, "-m", "http.server", "--bind", pair.addr_a, "8000"]
    return subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _fetch_from_b(pair: NetnsPair, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
    code = f"import urllib.request as u; print(len(u.urlopen('http://{pair.addr_a}:8000/blob', timeout=5).read()))"
    argv = [*pair.exec_prefix("b"), sys.executable, "-c", code]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)


def _wait_fetch(pair: NetnsPair) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + 30
    while True:
        done = _fetch_from_b(pair)
        if done.returncode == 0 or time.monotonic() > deadline:
            return done
        time.sleep(0.2)


def test_bytes_cross_the_shaped_veth_and_are_counted(pair: NetnsPair, tmp_path: Path) -> None:
    server = _serve(pair, tmp_path)
    try:
        assert _wait_fetch(pair).stdout.strip() == str(PAYLOAD)  # server up, link warm
        before = pair.counters("a")
        started = time.monotonic()
        done = _fetch_from_b(pair)
        took = time.monotonic() - started
        moved = pair.counters("a") - before
        assert done.stdout.strip() == str(PAYLOAD), done.stderr
        # the payload plus HTTP and TCP/IP headers (~3 % at a 1500-byte MTU) plus the response line
        assert PAYLOAD <= moved.tx_bytes <= PAYLOAD * 1.05 + 4096, moved
        # the kernel's token bucket: no faster than its rate once the burst is spent
        assert took >= pair.shape.min_seconds(PAYLOAD), (took, pair.shape)
        assert pair.qdisc("a")["kind"] == "tbf"

        port = pair.expose("a", pair.addr_a, 8000)
        assert len(httpx.get(f"http://127.0.0.1:{port}/blob", timeout=30).content) == PAYLOAD

        pair.cut()
        cut = _fetch_from_b(pair)
        assert cut.returncode != 0 and "unreachable" in cut.stderr.lower(), cut.stderr[-300:]
        pair.restore()
        assert _wait_fetch(pair).stdout.strip() == str(PAYLOAD)
        assert pair.qdisc("a")["kind"] == "tbf"
    finally:
        server.kill()
        server.wait(10)


def _owner(code: str) -> tuple[subprocess.Popen[str], list[str]]:
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    names = owner.stdout.readline().split()
    owner.stdout.close()
    if not names:
        owner.wait(30)
        skip_or_fail("network namespaces refused (the owner process could not create them)")
    return owner, names


OWNER = (
    "import time; from prfaas_local.netns import NetnsPair\n"
    "p = NetnsPair(); p.create(); print(p.ns_a, p.ns_b, flush=True); time.sleep(600)\n"
)


def test_a_killed_owner_leaves_namespaces_that_the_next_run_removes() -> None:
    owner, names = _owner(OWNER)
    owner.kill()
    owner.wait(10)
    assert names[0] in _namespaces()
    removed = clean_leftovers()
    assert set(names) <= set(removed)
    assert names[0] not in _namespaces() and names[1] not in _namespaces()


def test_sigterm_tears_the_namespaces_down() -> None:
    owner, names = _owner(OWNER)
    assert names[0] in _namespaces()
    owner.terminate()
    owner.wait(30)
    assert names[0] not in _namespaces() and names[1] not in _namespaces()
