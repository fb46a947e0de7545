"""The operator harness with its parts in processes of their own: for the scale benchmark.

:class:`~.operator_harness.Harness` runs the Kubernetes API emulator, the Prometheus exporter and the fake
remote gateway as threads of the test's own process, which is right for tests (they read the emulator's
counters and set the exporter's queues directly). At thousands of objects they are busy, and in one
process they share one GIL: a benchmark that measures the operator then measures them as well (each answer
the operator waits for waits for the GIL). :class:`SplitHarness` starts each in its own process (the
emulator; the exporter, whose Prometheus is a process of its own already; the gateway) and talks to them over a
pipe, so each has its own interpreter, and :meth:`SplitHarness.cpu` reports each one's CPU seconds beside the
operator's. Its methods are the Harness's (over HTTP as before); what a test would read from the emulator's or
the exporter's objects goes through small proxies (``emu.k8s.requests``, ``emu.k8s.watches``,
``prom.exporter.enabled_namespaces``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from collections import Counter
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from .k8s_emulator import EmulatorThread
from .operator_harness import Gateway, Harness
from .prom import PrometheusStack


def _serve(role: str, conn: Connection, arg: Any) -> None:
    """A child process: start ``role`` and answer the parent's commands until "stop"."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it (a ^C reaches the whole group)
    obj: Any
    if role == "emulator":
        obj = EmulatorThread().start()
        conn.send({"url": obj.url, "pid": os.getpid()})
    elif role == "exporter":
        obj = PrometheusStack(arg[0], arg[1]).start()
        assert obj.proc is not None
        conn.send({"url": obj.url, "pid": os.getpid(), "prometheus_pid": obj.proc.pid})
    else:
        obj = Gateway()
        conn.send({"url": obj.url, "pid": os.getpid()})
    asked = False
    try:
        while True:
            try:
                cmd, value = conn.recv()
            except EOFError:  # the parent is gone (killed): what this part started is stopped all the same
                return
            if cmd == "stop":
                asked = True
                return
            if cmd in ("requests", "watches"):
                conn.send(_copy(getattr(obj.k8s, cmd)))
            elif cmd == "enable":
                obj.exporter.enabled_namespaces.add(value)
                conn.send(None)
            elif cmd == "disable":
                obj.exporter.enabled_namespaces.discard(value)
                conn.send(None)
            else:
                conn.send(ValueError(f"unknown command {cmd!r}"))
    finally:
        obj.stop()  # the exporter's Prometheus is a process of its own: it would outlive this one
        if asked:
            conn.send(None)


def _copy(counter: Counter[str]) -> Counter[str]:
    """A copy of a counter the emulator's thread is updating (a new key mid-copy: copy again)."""
    while True:
        try:
            return Counter(dict(counter))
        except RuntimeError:
            continue


class Child:
    """One part in its own process (spawned: a fresh interpreter), and the pipe to it."""

    def __init__(self, role: str, arg: Any = None) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(role, theirs, arg), name=f"harness-{role}", daemon=True)
        self.proc.start()
        theirs.close()
        if not self.conn.poll(60):
            self.proc.kill()
            raise RuntimeError(f"the harness's {role} did not start")
        self.info: dict[str, Any] = self.conn.recv()
        self.url: str = self.info["url"]
        self.pid: int = self.info["pid"]
        self._lock = threading.Lock()

    def call(self, cmd: str, value: Any = None) -> Any:
        with self._lock:
            self.conn.send((cmd, value))
            out = self.conn.recv()
        if isinstance(out, Exception):
            raise out
        return out

    def stop(self) -> None:
        if self.proc.is_alive():
            with contextlib.suppress(OSError, EOFError):
                self.call("stop")
            self.proc.join(60)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()


class _K8s:
    def __init__(self, child: Child) -> None:
        self._child = child

    @property
    def requests(self) -> Counter[str]:
        return Counter(self._child.call("requests"))

    @property
    def watches(self) -> Counter[str]:
        return Counter(self._child.call("watches"))


class _Emulator:
    def __init__(self, child: Child) -> None:
        self.child = child
        self.url = child.url
        self.k8s = _K8s(child)

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        return EmulatorThread.write_kubeconfig(self, path, namespace)  # type: ignore[arg-type]  # uses .url only

    def stop(self) -> None:
        self.child.stop()


class _Namespaces:
    """The exporter's enabled namespaces, set in its process."""

    def __init__(self, child: Child) -> None:
        self._child = child

    def add(self, namespace: str) -> None:
        self._child.call("enable", namespace)

    def discard(self, namespace: str) -> None:
        self._child.call("disable", namespace)


class _Exporter:
    def __init__(self, child: Child) -> None:
        self.enabled_namespaces = _Namespaces(child)


class _Prometheus:
    def __init__(self, child: Child) -> None:
        self.child = child
        self.url = child.url
        self.exporter = _Exporter(child)

    def stop(self) -> None:
        self.child.stop()


class _Gateway:
    def __init__(self, child: Child) -> None:
        self.child = child
        self.url = child.url

    def stop(self) -> None:
        self.child.stop()


class SplitHarness(Harness):
    """:class:`~.operator_harness.Harness` with the emulator, the exporter (and its Prometheus) and the gateway
    each in a process of its own (see the module docstring)."""

    def __init__(self, tmp: Path, scrape_s: float = 1.0) -> None:
        # (not super().__init__(): it would start the parts as threads of this process)
        import httpx

        self.tmp = tmp
        self._children: list[Child] = []
        try:
            emu = self._start(Child("emulator"))
            self.emu = _Emulator(emu)  # type: ignore[assignment]
            self.kubeconfig = self.emu.write_kubeconfig(tmp / "kubeconfig")
            self.http = httpx.Client(base_url=self.emu.url, timeout=30)
            self.prom = _Prometheus(self._start(Child("exporter", (emu.url, scrape_s))))  # type: ignore[assignment]
            self.gateway = _Gateway(self._start(Child("gateway")))  # type: ignore[assignment]
        except BaseException:
            for child in reversed(self._children):
                child.stop()
            raise
        self.operators = []

    def _start(self, child: Child) -> Child:
        self._children.append(child)
        return child

    def pids(self) -> dict[str, int]:
        """The harness's processes by part: ``emulator``, ``exporter``, ``prometheus``, ``gateway``."""
        emu, exporter, gateway = self._children
        return {
            "emulator": emu.pid,
            "exporter": exporter.pid,
            "prometheus": exporter.info["prometheus_pid"],
            "gateway": gateway.pid,
        }
