"""The stack's processes: started with their output in a log file each, stopped (SIGTERM, then SIGKILL) as a
group; the one process group that ``prfaas up``, the benchmarks and the tests use."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path


class Processes:
    """Named child processes, each logging to ``log_dir/NAME.log``; :meth:`stop_all` ends them all."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        proc = spawn_process(argv, self.log_dir / f"{name}.log", env)
        self.procs.append((name, proc))
        return proc

    def log(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def check_alive(self) -> None:
        """Raise (naming the process and the end of its log) when one has exited."""
        for name, proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with status {proc.returncode}:\n{self.log(name)[-3000:]}")

    def stop(self, name: str) -> None:
        """Stop every process called ``name`` and forget it."""
        for entry in [e for e in self.procs if e[0] == name]:
            stop_processes([entry[1]])
            self.procs.remove(entry)

    def stop_all(self) -> None:
        stop_processes([proc for _, proc in self.procs])


def exit_on_sigterm() -> None:
    """Turn SIGTERM into ``SystemExit`` (in the main thread), so the ``finally`` that stops a stack runs when
    the process itself is terminated, not only on Ctrl-C or an error."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


def spawn_process(
    argv: list[str], log: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a child with its output in ``log`` (discarded without one) and ``env`` over this environment."""
    out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - the child keeps its descriptor
    try:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})}
        )
    finally:
        if log is not None:
            out.close()  # type: ignore[union-attr]


def stop_processes(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every one, then SIGKILL whichever has not exited 5 s later."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
