"""``prfaas router --workers N``: N router processes on one port, so one pod's router uses more than one core.

One Python process serves a request path on one core (its event loop); a router in front of many engines at high
request rates needs more. The parent starts N workers and only supervises them:

* **one port:** every worker listens on ``--host:--port`` with SO_REUSEPORT, and the kernel spreads the client
  connections over them (a connection stays with its worker);
* **one set of books:** the workers are replicas of each other (:mod:`prfaas_router.state.peers`): each also listens
  on a loopback port of its own, and is given its siblings' as ``--peers`` — each counts the others' local prefills
  in its queues as soon as they start, as router replicas do. The user's ``--peers``/``--peers-dns`` still apply
  (a book another pod sends reaches one worker, whose siblings see that pod's work from the engines' counts);
  their ``--peers-token-file`` is shared, else the parent writes a random token only the workers read;
* **one scrape:** the workers share a PROMETHEUS_MULTIPROC_DIR (the parent's, else a private folder, emptied at
  start): ``/metrics`` on any of them answers every worker's series (:func:`prfaas_router.state.metrics.exposition`);
* **one lifetime:** SIGTERM or SIGINT to the parent stops the workers and exits 0; a worker that exits on its own
  (a crash, a configuration it refuses) stops the others and the parent exits 1, so the pod restarts whole.

Each worker keeps its own view of the link and its own breakers, as replicas do. A gateway (``mode: gateway``) is
one process by design (its link admission is that process's state): the workers refuse it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import FrameType

import structlog

from prfaas_local.ports import free_port

from .output import EXIT_ERROR, EXIT_OK

log = structlog.get_logger("prfaas.router.workers")


def worker_argv(args: argparse.Namespace, side_port: int, peers: list[str], token_file: str) -> list[str]:
    """The command line of one worker: the parent's options, its own side port, its siblings (and the user's
    peers) as ``--peers``, the shared token."""
    argv = [sys.executable, "-m", "prfaas_cli.main", "router", "--config", str(args.config)]
    argv += ["--host", args.host, "--port", str(args.port), "--log-level", args.log_level]
    argv += ["--worker-port", str(side_port), "--peers-token-file", token_file]
    if args.settings:
        argv += ["--settings", str(args.settings)]
    if args.wait_for_config:
        argv.append("--wait-for-config")
    if args.allow_insecure_gateway:
        argv.append("--allow-insecure-gateway")
    for model in args.model or ():
        argv += ["--model", model]
    for url in peers:
        argv += ["--peers", url]
    if args.peers_dns:
        argv += ["--peers-dns", args.peers_dns]
    return argv


def _metrics_dir(private: Path) -> str:
    """The multiprocess folder the workers share (PROMETHEUS_MULTIPROC_DIR when set, else ``private``), emptied of
    an earlier run's series."""
    folder = Path(os.environ.get("PROMETHEUS_MULTIPROC_DIR") or private)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.db"):
        stale.unlink(missing_ok=True)
    return str(folder)


def supervise(args: argparse.Namespace, peers: list[str]) -> int:
    """Start ``args.workers`` workers and wait: 0 once a signal stopped them, 1 when one exited on its own."""
    from prometheus_client import multiprocess

    ports = [free_port() for _ in range(args.workers)]
    with tempfile.TemporaryDirectory(prefix="prfaas-router-") as tmp:
        token_file = args.peers_token_file
        if not token_file:
            token_file = str(Path(tmp) / "workers-token")
            with open(os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                f.write(secrets.token_urlsafe(32))
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": _metrics_dir(Path(tmp) / "metrics")}
        stopping: list[int] = []
        workers: list[subprocess.Popen[bytes]] = []

        def stop(signum: int, _frame: FrameType | None) -> None:
            stopping.append(signum)
            _terminate(workers)

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            for port in ports:
                siblings = [f"http://127.0.0.1:{p}" for p in ports if p != port]
                workers.append(subprocess.Popen(worker_argv(args, port, [*peers, *siblings], token_file), env=env))
            log.info("router workers started", workers=args.workers, port=args.port, pids=[w.pid for w in workers])
            code = _wait(workers, stopping)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for proc in workers:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                multiprocess.mark_process_dead(proc.pid, env["PROMETHEUS_MULTIPROC_DIR"])  # type: ignore[no-untyped-call]
    return code


def _terminate(workers: list[subprocess.Popen[bytes]]) -> None:
    for proc in workers:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)


def _wait(workers: list[subprocess.Popen[bytes]], stopping: list[int]) -> int:
    """Until every worker has exited: the first to exit unasked stops the others (1); after a signal, 0."""
    alive = {w.pid: w for w in workers}
    failed = False
    while alive:
        try:
            pid, status = os.wait()  # a signal runs its handler, then the wait goes on (PEP 475)
        except ChildProcessError:
            break
        proc = alive.pop(pid, None)
        if proc is None:
            continue
        proc.returncode = os.waitstatus_to_exitcode(status)
        if not stopping and not failed:
            failed = True
            log.error("a router worker exited: stopping the others", pid=pid, code=proc.returncode)
            _terminate(workers)
    return EXIT_ERROR if failed else EXIT_OK
